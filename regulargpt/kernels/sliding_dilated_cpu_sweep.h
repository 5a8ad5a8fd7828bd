// The head sweep of sliding_dilated_cpu.cpp: AVX-512 forward and backward for every-position queries (query_start 0,
// query_step 1), C in {2, 4, 8, 16} keys, Dh = 16·NV with NV in {1, 2, 4, 8}, fp32 / bf16 / fp16 inputs.
//
// A work unit is one (batch b, head h), G neighbouring chains [s0, s0 + G) (chain s: the positions s + u·D; query p
// at step u of its chain sees the keys at steps u, u-1, ..., u-C+1 of the same chain) and a fixed range of steps.
// It visits step by step the G positions s0 + u·D + [0, G), copying (bf16 / fp16: widening) each row of k, v (and q,
// dout backward) once into compact rings that hold the last C steps, step u's chain c in slot (u mod C)·G + c: the C
// keys of a query are then G rows apart in L1, never the multiple of 4 KiB they often are in the tensors (D·Dh·4
// bytes), where they would share one L1 set and evict each other. Rows are prefetched into L2 kAheadRows positions
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
// A unit owns the dq, dk, dv rows of its steps; its backward recomputes dS for the C - 1 steps after them (not
// owned) so that its last keys gather without another unit's data. dr and dpad are per-unit partial sums, reduced in
// unit order by the caller: no atomics, bit-identical reruns with any thread count.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define SD_SWEEP 1
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>

namespace sdsweep {

constexpr int64_t kSweepRows = 2048;      // positions per work unit
// A unit's rings, C·G rows of each tensor it revisits: whole steps (G = D, sequential reads) when they fit in
// kStepRingBytes, else G chains within kChainRingBytes (L1). Measured at T = 65536, H = 8, Dh = 64, fp32
// (docs/KERNELS.md): C = D = 8 is fastest with whole steps, C = D = 16 with G = 2 forward, 1 backward.
constexpr int64_t kStepRingBytes = 64 << 10, kChainRingBytes = 16 << 10;

enum class Kind { f32, bf16, f16 };

struct Source {  // one tensor's rows of head h in batch b: row n at p + n·st elements
  const void* p;
  int64_t st;
};

// ---- conversions: 16 elements <-> one fp32 vector -------------------------------------------------------------
template <Kind K>
inline __m512 widen16(const void* x) {
  if constexpr (K == Kind::f32) return _mm512_loadu_ps(static_cast<const float*>(x));
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(x));
  if constexpr (K == Kind::f16) return _mm512_cvtph_ps(raw);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));  // bf16: the high half of fp32
}

template <Kind K>
constexpr int64_t element_bytes = K == Kind::f32 ? 4 : 2;

// Stores 16 lanes at dst (dst's element type), non-temporally when aligned: outputs are written once.
template <Kind K>
inline void narrow16(void* dst, __m512 x) {
  const bool aligned = reinterpret_cast<uintptr_t>(dst) % (16 * element_bytes<K>) == 0;
  if constexpr (K == Kind::f32) {
    float* d = static_cast<float*>(dst);
    return aligned ? _mm512_stream_ps(d, x) : _mm512_storeu_ps(d, x);
  }
  __m256i half;
  if constexpr (K == Kind::f16) {
    half = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {  // bf16, round to nearest even (c10::BFloat16's rounding), NaN kept quiet
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
    half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
  }
  __m256i* d = static_cast<__m256i*>(dst);
  return aligned ? _mm256_stream_si256(d, half) : _mm256_storeu_si256(d, half);
}

// exp(x) for x <= 0 (Cephes' expf: x = n·ln2 + r, a degree-7 polynomial in r, times 2^n; relative error ~1e-7).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// ---- hsum: C vectors of 16 partial sums -> one vector, lane j = the total of vector j --------------------------
// Four pairing levels halve the partials per vector (16 -> 8 -> 4 -> 2 -> 1) and the vectors (a lone vector pairs
// with itself); each level adds two shuffles of a pair, so a total never mixes two vectors. The levels leave the
// totals in a fixed lane order, found once (order<C>) and undone by one permute.
template <int N>
[[gnu::always_inline]] inline void pair_level(__m512* a, int level) {
  const int pairs = N > 1 ? N / 2 : 1;
  for (int i = 0; i < pairs; ++i) {
    const __m512 x = a[2 * i], y = N > 1 ? a[2 * i + 1] : a[0];
    __m512 lo, hi;
    if (level == 0) lo = _mm512_shuffle_f32x4(x, y, 0x44), hi = _mm512_shuffle_f32x4(x, y, 0xEE);
    else if (level == 1) lo = _mm512_shuffle_f32x4(x, y, 0x88), hi = _mm512_shuffle_f32x4(x, y, 0xDD);
    else if (level == 2)
      lo = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y))),
      hi = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
    else lo = _mm512_shuffle_ps(x, y, 0x88), hi = _mm512_shuffle_ps(x, y, 0xDD);
    a[i] = _mm512_add_ps(lo, hi);
  }
}

template <int C>
[[gnu::always_inline]] inline __m512 hsum_unordered(__m512 (&a)[C]) {
  pair_level<C>(a, 0);
  pair_level<(C > 1 ? C / 2 : 1)>(a, 1);
  pair_level<(C > 2 ? C / 4 : 1)>(a, 2);
  pair_level<(C > 4 ? C / 8 : 1)>(a, 3);
  return a[0];
}

template <int C>
const __m512i& order() {  // lane j of the permute: where hsum_unordered left vector j's total
  static const __m512i idx = [] {
    __m512 a[C];
    for (int j = 0; j < C; ++j) a[j] = _mm512_set1_ps(float(j + 1));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, hsum_unordered<C>(a));
    alignas(64) int32_t at[16] = {};
    for (int j = 0; j < C; ++j)
      for (int l = 15; l >= 0; --l)
        if (lanes[l] == 16.0f * float(j + 1)) at[j] = l;
    return _mm512_load_si512(at);
  }();
  return idx;
}

template <int C>
[[gnu::always_inline]] inline __m512 hsum(__m512 (&a)[C]) {
  return _mm512_permutexvar_ps(order<C>(), hsum_unordered<C>(a));
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
  for (int64_t b = 0; b < Dh * element_bytes<K>; b += 64) _mm_prefetch(at + b, _MM_HINT_T1);  // into L2: more misses in flight than L1 holds
}

template <Kind K>  // row n of x, widened, into dst (Dh floats)
inline void widen_row(const Source& x, int64_t n, int64_t Dh, float* dst) {
  const char* from = static_cast<const char*>(x.p) + n * x.st * element_bytes<K>;
  for (int64_t d = 0; d < Dh; d += 16) _mm512_store_ps(dst + d, widen16<K>(from + d * element_bytes<K>));
}

template <int NV>
[[gnu::always_inline]] inline void load_row(__m512 (&x)[NV], const float* row) {
  for (int v = 0; v < NV; ++v) x[v] = _mm512_loadu_ps(row + 16 * v);
}

template <Kind K, int NV>
[[gnu::always_inline]] inline void store_row(void* dst, const __m512 (&x)[NV]) {
  char* d = static_cast<char*>(dst);
  for (int v = 0; v < NV; ++v) narrow16<K>(d + 16 * v * element_bytes<K>, x[v]);
}

// acc_j = x ⊙ rows[j], j < C (all C: absent keys point at a pad or zero row and are masked after)
template <int C, int NV>
[[gnu::always_inline]] inline __m512 scores(const __m512 (&x)[NV], const float* const (&rows)[C]) {
  __m512 acc[C];
  for (int j = 0; j < C; ++j) {
    acc[j] = _mm512_mul_ps(x[0], _mm512_loadu_ps(rows[j]));
    for (int v = 1; v < NV; ++v) acc[j] = _mm512_fmadd_ps(x[v], _mm512_loadu_ps(rows[j] + 16 * v), acc[j]);
  }
  return hsum<C>(acc);
}

// y = Σ_{j<m} w[j] rows[j], in j order
template <int C, int NV>
[[gnu::always_inline]] inline void combine(__m512 (&y)[NV], const float* w, const float* const (&rows)[C], int m) {
  for (int v = 0; v < NV; ++v) y[v] = _mm512_setzero_ps();
  for (int j = 0; j < C; ++j) {
    if (j >= m) break;
    const __m512 wj = _mm512_set1_ps(w[j]);
    for (int v = 0; v < NV; ++v) y[v] = _mm512_fmadd_ps(wj, _mm512_loadu_ps(rows[j] + 16 * v), y[v]);
  }
}

// Slots. A unit keeps the rows of its last C steps in compact rings, step u's chain c in slot (u mod C)·G + c:
// the C keys of a query are G rows apart, never a multiple of 4 KiB as in the tensors (where D·Dh·4 bytes often
// is, and C keys in one L1 set would evict each other). slots[j]: the slot of key j (step u - j); returns how many
// keys are present (u - j >= 0; an absent key's slot is -1).
template <int C>
[[gnu::always_inline]] inline int key_slots(int64_t u, int64_t su, int64_t c, int64_t G, int64_t (&slots)[C]) {
  for (int j = 0, s = int(su); j < C; ++j, s = s == 0 ? C - 1 : s - 1) slots[j] = j <= u ? s * G + c : -1;
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

// A unit: batch b, head h (the rows below are already those of (b, h)), the G chains [s0, s0 + G) (chain s: the
// positions s + u·D) and their steps [u_lo, u_hi). It visits step by step the G positions s0 + u·D + [0, G): the
struct Unit {  // batch b, head h (the rows below are already those of (b, h)), chains [s0, s0 + G), steps [u_lo, u_hi)
  int64_t T, D, s0, G, u_lo, u_hi;
  float scale;
  const float* r;              // r[h, :C]
  const float *pad_k, *pad_v;  // fp32 pad rows (Dh), or nullptr: no pads (absent keys masked)
  float* probs;                // P of query p at probs + p·probs_st (C floats)
  int64_t probs_st;
};

constexpr int64_t kAheadRows = 16;  // rows are prefetched about this many positions before their step

template <Kind K, int C, int NV>
void forward_unit(const Unit& u, const Source& q, const Source& k, const Source& v, const Out& out) {
  constexpr int64_t Dh = 16 * NV;
  constexpr __mmask16 all = __mmask16((1u << C) - 1);
  const int64_t D = u.D, G = u.G, ring = C * G * Dh, ahead = (kAheadRows + G - 1) / G;
  float *ring_k = scratch(2 * ring), *ring_v = ring_k + ring;
  alignas(64) float zero[Dh] = {}, w[16];
  const float *absent_k = u.pad_k ? u.pad_k : zero, *absent_v = u.pad_v ? u.pad_v : zero;
  const __m512 rh = _mm512_maskz_loadu_ps(all, u.r), scale = _mm512_set1_ps(u.scale);
  const int64_t first = std::max<int64_t>(u.u_lo - (C - 1), 0);
  for (int64_t step = first, su = first % C; step < u.u_hi; ++step, su = su + 1 == C ? 0 : su + 1) {
    const int64_t base = u.s0 + step * D, width = std::min(G, u.T - base);
    if (width <= 0) break;
    for (int64_t c = 0, pa = base + ahead * D; c < G && pa + c < u.T; ++c)
      prefetch_row<K>(q, pa + c, Dh), prefetch_row<K>(k, pa + c, Dh), prefetch_row<K>(v, pa + c, Dh);
    for (int64_t c = 0; c < width; ++c) {
      const int64_t p = base + c;
      widen_row<K>(k, p, Dh, ring_k + (su * G + c) * Dh), widen_row<K>(v, p, Dh, ring_v + (su * G + c) * Dh);
      if (step < u.u_lo) continue;  // a step before the unit's: its keys only
      __m512 x[NV], y[NV];
      const char* qrow = static_cast<const char*>(q.p) + p * q.st * element_bytes<K>;
      for (int i = 0; i < NV; ++i) x[i] = widen16<K>(qrow + 16 * i * element_bytes<K>);
      int64_t slots[C];
      const float *kr[C], *vr[C];
      const int present = key_slots<C>(step, su, c, G, slots), m = u.pad_k ? C : present;
      rows_of<C>(ring_k, Dh, slots, absent_k, kr);
      const __mmask16 valid = __mmask16((1u << m) - 1);
      const __m512 s = _mm512_fmadd_ps(scores<C, NV>(x, kr), scale, rh);
      const __m512 top = _mm512_set1_ps(_mm512_mask_reduce_max_ps(valid, s));
      const __m512 e = _mm512_maskz_mov_ps(valid, exp_nonpositive(_mm512_sub_ps(s, top)));
      const __m512 P = _mm512_div_ps(e, _mm512_set1_ps(_mm512_mask_reduce_add_ps(valid, e)));
      _mm512_mask_storeu_ps(u.probs + p * u.probs_st, all, P);
      _mm512_store_ps(w, P);
      rows_of<C>(ring_v, Dh, slots, absent_v, vr);
      combine<C, NV>(y, w, vr, m);
      store_row<K, NV>(row_of<K>(out, p), y);
    }
  }
  _mm_sfence();
}

// This unit's partial sums, written (not accumulated): dr at part_r (C floats), dpad_k, dpad_v at part_k, part_v (Dh).
// The queries of the C - 1 steps after u_hi are recomputed (dS only): the last keys gather without another unit.
template <Kind K, int C, int NV>
void backward_unit(const Unit& u, const Source& q, const Source& k, const Source& v, const Source& dout,
                   const Out& dq, const Out& dk, const Out& dv, float* part_r, float* part_k, float* part_v) {
  constexpr int64_t Dh = 16 * NV, reach = C - 1;
  constexpr __mmask16 all = __mmask16((1u << C) - 1);
  const int64_t D = u.D, G = u.G, ring = C * G * Dh, ahead = (kAheadRows + G - 1) / G;
  float* buf = scratch(4 * ring + 2 * C * G * 16);
  float *ring_k = buf, *ring_v = buf + ring, *ring_q = buf + 2 * ring, *ring_g = buf + 3 * ring;
  float *dS_of = buf + 4 * ring, *P_of = dS_of + C * G * 16;  // scale·dS and P of the queries per slot, 16 lanes
  alignas(64) float zero[Dh] = {}, w[16], pw[16];
  const float *absent_k = u.pad_k ? u.pad_k : zero, *absent_v = u.pad_v ? u.pad_v : zero;
  const int64_t u_end = std::min((u.T - 1 - u.s0) / D + 1, u.u_hi + reach);  // steps with queries to visit
  const __m512 scale = _mm512_set1_ps(u.scale);
  __m512 dr = _mm512_setzero_ps(), dr_step = _mm512_setzero_ps(), dpk[NV], dpv[NV];
  for (int i = 0; i < NV; ++i) dpk[i] = dpv[i] = _mm512_setzero_ps();
  // dk_n, dv_n of key n (step w, chain c; sw = w mod C) from its queries at steps w + j, j < m
  const auto gather = [&](int64_t n, int64_t sw, int64_t c, int m) {
    const float *qr[C], *gr[C];
    alignas(64) float wk[16], wv[16];
    for (int j = 0, s = int(sw); j < C; ++j, s = s + 1 == C ? 0 : s + 1) {
      const int64_t slot = s * G + c;
      qr[j] = ring_q + slot * Dh, gr[j] = ring_g + slot * Dh, wk[j] = dS_of[slot * 16 + j], wv[j] = P_of[slot * 16 + j];
    }
    __m512 y[NV];
    combine<C, NV>(y, wk, qr, m), store_row<K, NV>(row_of<K>(dk, n), y);
    combine<C, NV>(y, wv, gr, m), store_row<K, NV>(row_of<K>(dv, n), y);
  };
  const int64_t first = std::max<int64_t>(u.u_lo - reach, 0);
  for (int64_t step = first, su = first % C; step < u_end; ++step, su = su + 1 == C ? 0 : su + 1) {
    const int64_t base = u.s0 + step * D, width = std::min(G, u.T - base);
    if (width <= 0) break;
    for (int64_t c = 0, pa = base + ahead * D; c < G && pa + c < u.T; ++c) {
      prefetch_row<K>(q, pa + c, Dh), prefetch_row<K>(k, pa + c, Dh), prefetch_row<K>(v, pa + c, Dh);
      prefetch_row<K>(dout, pa + c, Dh);
      _mm_prefetch(reinterpret_cast<const char*>(u.probs + (pa + c) * u.probs_st), _MM_HINT_T0);
    }
    for (int64_t c = 0; c < width; ++c) {
      const int64_t p = base + c, slot = su * G + c;
      widen_row<K>(k, p, Dh, ring_k + slot * Dh), widen_row<K>(v, p, Dh, ring_v + slot * Dh);
      if (step < u.u_lo) continue;  // a step before the unit's: its keys only
      widen_row<K>(q, p, Dh, ring_q + slot * Dh), widen_row<K>(dout, p, Dh, ring_g + slot * Dh);
      const __m512 P = _mm512_maskz_loadu_ps(all, u.probs + p * u.probs_st);
      __m512 g[NV], y[NV];
      load_row<NV>(g, ring_g + slot * Dh);
      int64_t slots[C];
      const float *kr[C], *vr[C];
      const int present = key_slots<C>(step, su, c, G, slots), m = u.pad_k ? C : present;
      rows_of<C>(ring_v, Dh, slots, absent_v, vr);
      const __m512 dP = scores<C, NV>(g, vr);
      const float delta = _mm512_mask_reduce_add_ps(all, _mm512_mul_ps(P, dP));
      const __m512 dS = _mm512_maskz_mul_ps(all, P, _mm512_sub_ps(dP, _mm512_set1_ps(delta)));
      const __m512 dSs = _mm512_mul_ps(dS, scale);
      _mm512_store_ps(dS_of + slot * 16, dSs), _mm512_store_ps(P_of + slot * 16, P);
      if (step < u.u_hi) {
        dr_step = _mm512_add_ps(dr_step, dS);
        _mm512_store_ps(w, dSs);
        rows_of<C>(ring_k, Dh, slots, absent_k, kr);
        combine<C, NV>(y, w, kr, m), store_row<K, NV>(row_of<K>(dq, p), y);
        if (u.pad_k && present < C) {  // the absent keys j >= present read the pads
          __m512 x[NV];
          load_row<NV>(x, ring_q + slot * Dh);
          _mm512_store_ps(pw, P);
          for (int j = present; j < C; ++j)
            for (int i = 0; i < NV; ++i)
              dpk[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), x[i], dpk[i]),
              dpv[i] = _mm512_fmadd_ps(_mm512_set1_ps(pw[j]), g[i], dpv[i]);
        }
      }
      if (step - reach >= u.u_lo) gather(p - reach * D, su + 1 == C ? 0 : su + 1, c, C);  // its last query: p
    }
    if ((step & 31) == 31) dr = _mm512_add_ps(dr, dr_step), dr_step = _mm512_setzero_ps();  // short sums
  }
  // Keys whose last query lies past T (or past the visited steps): fewer queries, gathered at the end.
  for (int64_t step = std::max(u.u_lo, u_end - C); step < u.u_hi; ++step)
    for (int64_t c = 0; c < G; ++c) {
      const int64_t n = u.s0 + step * D + c;
      if (n >= u.T || (n + reach * D < u.T && step + reach < u_end)) continue;  // absent, or gathered in the loop
      gather(n, step % C, c, int(std::min<int64_t>(C, (u.T - 1 - n) / D + 1)));
    }
  dr = _mm512_add_ps(dr, dr_step);
  _mm512_mask_storeu_ps(part_r, all, dr);
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(part_k + 16 * i, dpk[i]), _mm512_storeu_ps(part_v + 16 * i, dpv[i]);
  _mm_sfence();
}

}  // namespace sdsweep
#endif
