// The head sweep of sliding_dilated_cpu.cpp: forward and backward, on 16 fp32 lanes (sliding_dilated_cpu_lanes.h:
// AVX-512, or AVX2 + FMA + F16C), for every-position queries (query_start 0,
// query_step 1), C in {2, 4, 8, 16} keys, Dh = 16·NV with NV in {1, 2, 4, 8}, fp32 / bf16 / fp16 inputs.
//
// A work unit is one (batch b, head h), G neighbouring chains [s0, s0 + G) (chain s: the positions s + u·D; query p
// at step u of its chain sees the keys at steps u, u-1, ..., u-C+1 of the same chain) and a fixed range of steps.
// It visits step by step the G positions s0 + u·D + [0, G), copying (bf16 / fp16: widening) each row of k, v (and q,
// dout backward) once into compact rings that hold the last R steps (backward R = C + 1; forward R = ring_steps<C>(G)),
// step u's chain c in slot (u mod R)·G + c: the C keys of a query are then G rows apart in L1, never the multiple of
// 4 KiB they often are in the tensors (D·Dh·4 bytes), where they would share one L1 set and evict each other. Rows are prefetched into L2 kAheadRows positions
// ahead. Per (query, head), with the query's NV vectors in registers:
//
//   forward   acc_j = q ⊙ k_{p-jD} (NV FMAs each), s = hsum(acc) · scale + r_h   (lane j: key j; hsum below)
//             P = exp(s - max s) / Σ exp (lanes j < m; m = C with pads, else the keys with p - jD >= 0)
//             out_p = Σ_j P_j v_{p-jD}                       (an absent key, p - jD < 0, reads the pad row)
//   backward  dP = hsum(dout ⊙ v_{p-jD}),  delta = Σ_j P_j dP_j,  dS = P ⊙ (dP - delta)
//             dq_p = scale Σ_j dS_j k_{p-jD};  dr_h += dS;  dpad_k += scale dS_j q_p, dpad_v += P_j dout_p (absent j)
//             and, in gather form once query n + (C-1)·D has left its dS and P in the ring (the last query of key n):
//             dk_n = scale Σ_j dS[n + jD]_j q_{n+jD},  dv_n = Σ_j P[n + jD]_j dout_{n+jD}
//
// A unit owns the dq, dk, dv rows of its steps; its backward (sliding_dilated_cpu_row_backward.h) recomputes dS for
// the C - 1 steps after them (not owned) so that its last keys gather without another unit's data. dr and dpad are
// per-unit partial sums, reduced in unit order by the caller: no atomics, bit-identical reruns with any thread count.
#pragma once

#include "sliding_dilated_cpu_lanes.h"

#ifdef SD_LANES
#define SD_SWEEP 1

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>

namespace sdsweep {

using namespace sdlanes;

constexpr int64_t kSweepRows = 2048;      // positions per work unit
// A unit's rings, C·G rows of each tensor it revisits: whole steps (G = D, sequential reads) when they fit in
// kStepRingBytes (L2), else G chains within kChainRingBytes (L1). Measured at T = 65536, H = 8, Dh = 64, fp32, on
// AVX2 (docs/KERNELS.md): whole steps beat G = 2 chains 0.7x at C = D = 16 forward; backward G = 1 is fastest there.
constexpr int64_t kStepRingBytes = 128 << 10, kChainRingBytes = 16 << 10;
// kOneChain: on AVX-512 some units walk one chain (G = 1) instead, measured faster on Zen 5 (T = 65536, H = 8,
// docs/KERNELS.md). Forward at C = 16: 0.47-0.72x the time of whole steps at D = 16 (Dh 16-64, T = 16384 too, both
// layouts), 0.88x fp32 / 0.99x bf16 of G = 2 at D = 256. Forward at C = 4, 8 in (B, T, H, Dh) tensors (a projection's
// views): 0.69-0.80x bf16, 0.90-1.0x fp32; not where a head's rows are adjacent ((B, H, T, Dh): 1.02-1.18x there).
// Row backward at C = 4, 8: 0.75-0.90x fp32 (both layouts), 0.68-0.70x bf16 in (B, T, H, Dh); not in bf16 / fp16
// with adjacent rows (1.04-1.17x: whole steps read long runs). C = 2 in (B, T, H, Dh): forward 0.90x fp32, 0.57x
// bf16, backward 0.81x, 0.48x; not with adjacent rows (backward fp32 1.18x). AVX2: off (whole steps were faster).
constexpr bool kOneChain = SD_LANES == 512;
inline std::atomic<bool> one_chain_allowed{true};  // off: the ring rule everywhere (benchmarks compare the two)

struct Source {  // one tensor's rows of head h in batch b: row n at p + n·st elements
  const void* p;
  int64_t st;
};

// exp(x) for x <= 0 (Cephes' expf: x = n·ln2 + r, a degree-7 polynomial in r, times 2^n; relative error ~1e-7).
inline F exp_nonpositive(F x) {
  x = max(x, set1(-87.0f));
  const F n = round_nearest(mul(x, set1(1.44269504088896341f)));
  F r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  F y = set1(1.9875691500e-4f);
  y = fmadd(y, r, set1(1.3981999507e-3f));
  y = fmadd(y, r, set1(8.3334519073e-3f));
  y = fmadd(y, r, set1(4.1665795894e-2f));
  y = fmadd(y, r, set1(1.6666665459e-1f));
  y = fmadd(y, r, set1(5.0000001201e-1f));
  y = fmadd(y, mul(r, r), add(r, set1(1.0f)));
  return scale2(y, n);
}

// ---- rows -----------------------------------------------------------------------------------------------------
struct AlignedFloats {
  std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
  explicit AlignedFloats(int64_t n)
      : data(static_cast<float*>(std::aligned_alloc(64, std::max<int64_t>(64, (n * 4 + 63) / 64 * 64))), &std::free) {}
  float* get() const { return data.get(); }
};

inline float* scratch(int64_t floats) {  // this thread's scratch (64-byte aligned), kept from unit to unit
  thread_local AlignedFloats buf(0);
  thread_local int64_t size = 0;
  if (floats > size) buf = AlignedFloats(floats), size = floats;
  return buf.get();
}

template <Kind K>  // the cache lines of row n of x (Dh elements) into L1, ahead of their use
inline void prefetch_row(const Source& x, int64_t n, int64_t Dh) {
  const char* at = static_cast<const char*>(x.p) + n * x.st * element_bytes<K>;
  // into L2: more misses in flight than L1 holds
  for (int64_t b = 0; b < Dh * element_bytes<K>; b += 64) _mm_prefetch(at + b, _MM_HINT_T1);
}

template <Kind K>  // row n of x, widened, into dst (Dh floats)
inline void widen_row(const Source& x, int64_t n, int64_t Dh, float* dst) {
  const char* from = static_cast<const char*>(x.p) + n * x.st * element_bytes<K>;
  for (int64_t d = 0; d < Dh; d += 16) store(dst + d, widen16<K>(from + d * element_bytes<K>));
}

template <int NV>
[[gnu::always_inline]] inline void load_row(F (&x)[NV], const float* row) {
  for (int v = 0; v < NV; ++v) x[v] = loadu(row + 16 * v);
}

template <Kind K, int NV>
[[gnu::always_inline]] inline void store_row(void* dst, const F (&x)[NV]) {
  char* d = static_cast<char*>(dst);
  for (int v = 0; v < NV; ++v) narrow16<K>(d + 16 * v * element_bytes<K>, x[v]);
}

// acc_j = x ⊙ rows[j], j < C (all C: absent keys point at a pad or zero row and are masked after)
template <int C, int NV>
[[gnu::always_inline]] inline F scores(const F (&x)[NV], const float* const (&rows)[C]) {
  F acc[C];
  for (int j = 0; j < C; ++j) {
    acc[j] = mul(x[0], loadu(rows[j]));
    for (int v = 1; v < NV; ++v) acc[j] = fmadd(x[v], loadu(rows[j] + 16 * v), acc[j]);
  }
  return hsum<C>(acc);
}

// y = Σ_{j<m} w[j] rows[j], in j order
template <int C, int NV>
[[gnu::always_inline]] inline void combine(F (&y)[NV], const float* w, const float* const (&rows)[C], int m) {
  for (int v = 0; v < NV; ++v) y[v] = zero();
  for (int j = 0; j < C; ++j) {
    if (j >= m) break;
    const F wj = set1(w[j]);
    for (int v = 0; v < NV; ++v) y[v] = fmadd(wj, loadu(rows[j] + 16 * v), y[v]);
  }
}

// The same chain's queries at steps u and u + 1 share C - 1 keys: rows[i] is the key row of step u + 1 - i
// (i <= C), key i of query u + 1 and key i - 1 of query u. scores_pair and combine_pair load each shared row once
// for both queries (C + 1 rows, C + 2 at C = 16, instead of 2·C), with the sums of scores and combine in the same
// order, so the same bits. Worked example, C = 2: rows = {k_{u+1}, k_u, k_{u-1}}; query u + 1 dots rows 0, 1 and
// query u rows 1, 2, and row 1 is read once.
template <int C, int NV>
[[gnu::always_inline]] inline void scores_pair(const F (&x0)[NV], const F (&x1)[NV], const float* const (&rows)[C + 1],
                                               F& s0, F& s1) {
  constexpr int J = C < 8 ? C : 8;  // keys per pass: 2·J accumulators in registers
  F a0[C], a1[C];
  for (int j0 = 0; j0 < C; j0 += J)
    for (int i = j0; i <= j0 + J; ++i)
      for (int v = 0; v < NV; ++v) {
        const F r = loadu(rows[i] + 16 * v);
        if (i < j0 + J) a1[i] = v == 0 ? mul(x1[0], r) : fmadd(x1[v], r, a1[i]);
        if (i > j0) a0[i - 1] = v == 0 ? mul(x0[0], r) : fmadd(x0[v], r, a0[i - 1]);
      }
  s0 = hsum<C>(a0), s1 = hsum<C>(a1);
}

template <int C, int NV>  // y0 = Σ_j w0[j] rows[j + 1], y1 = Σ_j w1[j] rows[j], in j order (all C keys present)
[[gnu::always_inline]] inline void combine_pair(F (&y0)[NV], F (&y1)[NV], const float* w0, const float* w1,
                                                const float* const (&rows)[C + 1]) {
  for (int v = 0; v < NV; ++v) y0[v] = y1[v] = zero();
  for (int i = 0; i <= C; ++i) {
    const F a = set1(i < C ? w1[i] : 0.0f), b = set1(i > 0 ? w0[i - 1] : 0.0f);
    for (int v = 0; v < NV; ++v) {
      const F r = loadu(rows[i] + 16 * v);
      if (i < C) y1[v] = fmadd(a, r, y1[v]);
      if (i > 0) y0[v] = fmadd(b, r, y0[v]);
    }
  }
}

// Slots. A unit keeps the rows of its last R steps in compact rings, step u's chain c in slot (u mod R)·G + c:
// the C keys of a query are G rows apart, never a multiple of 4 KiB as in the tensors (where D·Dh·4 bytes often
// is, and C keys in one L1 set would evict each other). slots[j]: the slot of key j (step u - j); returns how many
// keys are present (u - j >= 0; an absent key's slot is -1).
template <int C>
[[gnu::always_inline]] inline int key_slots(int64_t u, int64_t su, int64_t c, int64_t G, int64_t R,
                                            int64_t (&slots)[C]) {
  for (int64_t j = 0, s = su; j < C; ++j, s = s == 0 ? R - 1 : s - 1) slots[j] = j <= u ? s * G + c : -1;
  return int(std::min<int64_t>(C, u + 1));
}

template <int C>  // rows[j]: ring row of slot j, or `absent` (a pad or zero row)
[[gnu::always_inline]] inline void rows_of(const float* ring, int64_t Dh, const int64_t (&slots)[C],
                                           const float* absent, const float* (&rows)[C]) {
  for (int j = 0; j < C; ++j) rows[j] = slots[j] >= 0 ? ring + slots[j] * Dh : absent;
}

// ---- the units ------------------------------------------------------------------------------------------------
struct Out {  // rows of one output tensor of head h: row n at p + n·st elements
  void* p;
  int64_t st;
};

template <Kind K>
void* row_of(const Out& o, int64_t n) { return static_cast<char*>(o.p) + n * o.st * element_bytes<K>; }

struct Unit {  // batch b, head h (the rows below are already those of (b, h)), chains [s0, s0 + G), steps [u_lo, u_hi)
  int64_t T, D, s0, G, u_lo, u_hi;
  float scale;
  const float* r;              // r[h, :C]
  const float *pad_k, *pad_v;  // fp32 pad rows (Dh), or nullptr: no pads (absent keys masked)
  float* probs;                // P of query p at probs + p·probs_st (C floats)
  int64_t probs_st;
};

// Rows are prefetched about this many positions ahead, one position per query visited: a burst of a whole step's
// prefetches fills the miss queue and stalls (spread out: 0.8x the time at C = D = 8, T = 65536).
constexpr int64_t kAheadRows = 16;

// The forward takes its queries in groups of kGroup visits: the group's scores first, then its softmaxes, then its
// weighted sums. Each phase is kGroup independent chains (one query's softmax is a long dependent chain: hsum, max,
// exp, sum, divide), which overlap where one query's would not: 0.87-0.93x the forward's time at C = 8 (T = 512 in
// L3 and T = 65536). Its rings keep ring_steps<C>(G) steps: C + 1 for a pair of steps (scores_pair), plus those the
// group's oldest query may lag behind, plus one.
constexpr int kGroup = 8;
inline std::atomic<bool> step_pairs_allowed{true};  // off: every query alone (benchmarks compare the two)
template <int C>
constexpr int64_t ring_steps(int64_t G) { return C + 2 + (kGroup - 1 + G - 1) / G; }

template <Kind K, int C, int NV>
void forward_unit(const Unit& unit, const Source& q_in, const Source& k_in, const Source& v_in, const Out& out_in) {
  constexpr int64_t Dh = 16 * NV;
  const Unit u = unit;  // local copies: stores through float* cannot alias them, so no reloads in the loop
  const Source q = q_in, k = k_in, v = v_in;
  const Out out = out_in;
  const int64_t D = u.D, G = u.G, R = ring_steps<C>(G), ring = R * G * Dh, ahead = (kAheadRows + G - 1) / G;
  float *ring_k = scratch(2 * ring), *ring_v = ring_k + ring;
  alignas(64) float zero_row[Dh] = {}, s_of[kGroup + 1][16], w_of[kGroup + 1][16];  // + 1: a pair may end a group
  int64_t p_of[kGroup + 1];
  const float* vr_of[kGroup + 1][C];
  int m_of[kGroup + 1], pending = 0;
  bool paired[kGroup + 1];  // entries i and i + 1 are a pair of steps (combine_pair)
  const float *absent_k = u.pad_k ? u.pad_k : zero_row, *absent_v = u.pad_v ? u.pad_v : zero_row;
  const F rh = load_first<C>(u.r), scale = set1(u.scale);
  float* const probs = u.probs;
  const int64_t probs_st = u.probs_st;
  const auto flush = [&] {
    for (int i = 0; i < pending; ++i) {
      const M valid = first(m_of[i]);
      const F s = load(s_of[i]);
      const F top = set1(reduce_max(valid, s));
      const F e = maskz(valid, exp_nonpositive(sub(s, top)));
      const F P = div(e, set1(reduce_add(valid, e)));
      store_first<C>(probs + p_of[i] * probs_st, P);
      store(w_of[i], P);
    }
    for (int i = 0; i < pending; ++i) {
      F y[NV];
      if (paired[i]) {  // entries i (step u) and i + 1 (step u + 1, the same chain)
        const float* rows[C + 1];
        rows[0] = vr_of[i + 1][0];
        for (int j = 0; j < C; ++j) rows[j + 1] = vr_of[i][j];
        F y1[NV];
        combine_pair<C, NV>(y, y1, w_of[i], w_of[i + 1], rows);
        store_row<K, NV>(row_of<K>(out, p_of[i]), y), store_row<K, NV>(row_of<K>(out, p_of[++i]), y1);
        continue;
      }
      combine<C, NV>(y, w_of[i], vr_of[i], m_of[i]);
      store_row<K, NV>(row_of<K>(out, p_of[i]), y);
    }
    pending = 0;
  };
  const bool pairs = step_pairs_allowed.load(std::memory_order_relaxed);
  const int64_t from_step = std::max<int64_t>(u.u_lo - (C - 1), 0);
  for (int64_t step = from_step, su = from_step % R, next; step < u.u_hi; su = (su + next - step) % R, step = next) {
    const int64_t base = u.s0 + step * D, width = std::min(G, u.T - base);
    if (width <= 0) break;
    // steps u and u + 1 together where both are the unit's and all their keys are present (scores_pair)
    const bool pair = pairs && step >= u.u_lo && step >= C - 1 && step + 1 < u.u_hi && base + D < u.T;
    const int64_t width1 = pair ? std::min(G, u.T - base - D) : 0, s1 = su + 1 == R ? 0 : su + 1;
    next = step + (pair ? 2 : 1);
    float *kb[C], *vb[C];  // key j's step (step - j) in the rings, or nullptr: absent
    for (int j = 0; j < C; ++j) {
      const int64_t s = su - j < 0 ? su - j + R : su - j;
      kb[j] = j <= step ? ring_k + s * G * Dh : nullptr, vb[j] = j <= step ? ring_v + s * G * Dh : nullptr;
    }
    float *kb1 = ring_k + s1 * G * Dh, *vb1 = ring_v + s1 * G * Dh;  // step + 1's rows (with a pair)
    const int present = int(std::min<int64_t>(C, step + 1)), m = u.pad_k ? C : present;
    for (int64_t c = 0; c < width; ++c) {
      const int64_t p = base + c;
      const bool both = c < width1;
      for (int64_t pa = p + ahead * D, e = pa + (both ? D : 0); pa <= e && pa < u.T; pa += D)
        prefetch_row<K>(q, pa, Dh), prefetch_row<K>(k, pa, Dh), prefetch_row<K>(v, pa, Dh);
      widen_row<K>(k, p, Dh, kb[0] + c * Dh), widen_row<K>(v, p, Dh, vb[0] + c * Dh);
      if (both) widen_row<K>(k, p + D, Dh, kb1 + c * Dh), widen_row<K>(v, p + D, Dh, vb1 + c * Dh);
      if (step < u.u_lo) continue;  // a step before the unit's: its keys only
      F x[NV];
      const char* qrow = static_cast<const char*>(q.p) + p * q.st * element_bytes<K>;
      for (int i = 0; i < NV; ++i) x[i] = widen16<K>(qrow + 16 * i * element_bytes<K>);
      const float* kr[C];
      const float** vr = vr_of[pending];
      if (present == C) {
        for (int j = 0; j < C; ++j) kr[j] = kb[j] + c * Dh, vr[j] = vb[j] + c * Dh;
      } else {
        for (int j = 0; j < C; ++j)
          kr[j] = kb[j] ? kb[j] + c * Dh : absent_k, vr[j] = vb[j] ? vb[j] + c * Dh : absent_v;
      }
      m_of[pending] = m, p_of[pending] = p, paired[pending] = both;
      if (both) {
        F x1[NV], s0, s1v;
        const char* qrow1 = qrow + D * q.st * element_bytes<K>;
        for (int i = 0; i < NV; ++i) x1[i] = widen16<K>(qrow1 + 16 * i * element_bytes<K>);
        const float* rows[C + 1];
        rows[0] = kb1 + c * Dh;
        for (int j = 0; j < C; ++j) rows[j + 1] = kr[j];
        scores_pair<C, NV>(x, x1, rows, s0, s1v);
        store(s_of[pending], fmadd(s0, scale, rh)), ++pending;
        const float** vr1 = vr_of[pending];
        vr1[0] = vb1 + c * Dh;
        for (int j = 1; j < C; ++j) vr1[j] = vr[j - 1];
        m_of[pending] = C, p_of[pending] = p + D, paired[pending] = false;
        store(s_of[pending], fmadd(s1v, scale, rh));
      } else {
        store(s_of[pending], fmadd(scores<C, NV>(x, kr), scale, rh));
      }
      if (++pending >= kGroup) flush();
    }
  }
  flush();
  _mm_sfence();
}

}  // namespace sdsweep
#endif
