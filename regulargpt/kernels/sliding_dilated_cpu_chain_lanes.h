// The head sweep's backward with its lanes across chains (sliding_dilated_cpu.cpp takes it on AVX2 builds when a
// unit has G >= 8 chains, i.e. D >= 8): the work units, rings, partial sums and outputs of sdsweep::backward_unit,
// but the 8 fp32 lanes of a vector hold 8 neighbouring chains (positions p0 + i, i < 8, of one step), not 8
// dimensions of one row. Rows enter the rings transposed, as panels: panel[d·8 + i] = x[p0 + i][d] (Dh × 8
// floats). Key j of a panel's 8 queries is then the same panel of ring step u - j, and
//
//   dP_j   = Σ_d dout_panel[d] ⊙ v_panel_j[d]             (Dh FMAs for 8 queries: no horizontal sums)
//   delta  = Σ_j P_j ⊙ dP_j,  dS_j = P_j ⊙ (dP_j - delta)  (lane-wise; P_j from the saved rows, transposed)
//   dq     = scale Σ_j dS_j ⊙ k_panel_j                    (transposed back to rows, 8 × 8 blocks)
//   dk_n   = scale Σ_j dS[n + jD]_j ⊙ q_panel(n + jD),  dv_n = Σ_j P[n + jD]_j ⊙ dout_panel(n + jD)
//
// for the 8 keys of a panel once their last queries (step + C - 1) are in the ring. Worked example, C = 8, D = 8:
// a step is 8 positions 8u .. 8u + 7, one panel; query 8u + i's key j is lane i of step u - j's panel.
// A step's chains fill ceil(G / 8) panels; lanes past the last position (p >= T) hold zero rows and zero P, so
// zero dS: a key's gather may sum over them. Measured at T = 65536, H = 8, Dh = 64, 2 threads (docs/KERNELS.md):
// 0.62-0.76x the row backward's time at C = 16 (where the rows' hsums of 16 keys dominate), 0.97-1.03x at C = 8.
#pragma once

#include "sliding_dilated_cpu_sweep.h"

#ifdef SD_SWEEP

namespace sdchains {

using namespace sdsweep;

// r[t] = column t of the 8 × 8 matrix whose row i is r[i]
[[gnu::always_inline]] inline void transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

template <Kind K>  // 8 elements of kind K at x, in fp32
[[gnu::always_inline]] inline __m256 widen8(const void* x) {
  if constexpr (K == Kind::f32) return _mm256_loadu_ps(static_cast<const float*>(x));
  const __m128i raw = _mm_loadu_si128(static_cast<const __m128i*>(x));
  if constexpr (K == Kind::f16) return _mm256_cvtph_ps(raw);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));  // bf16: the high half of fp32
}

inline float lane_sum(__m256 x) {  // ((0+4) + (2+6)) + ((1+5) + (3+7))
  __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_add_ps(y, _mm_movehl_ps(y, y));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

// rows p0 + i of x (i < valid; zero rows after) into a panel: dst[d·8 + i] = x[p0 + i][d]. Between its 8 × 8
// blocks it prefetches (into L2) the rows ahead + i of x, a share of them per block, and calls each() (the caller's
// pending output rows). A panel's 32 prefetches in one burst cost a lanes forward (tried, dropped) 1.3-1.6x its time
// at T = 65536, C = 8 in the driver of docs/KERNELS.md; spread, they did not.
template <Kind K, typename Each>
inline void panel_in(const Source& x, int64_t p0, int valid, int64_t Dh, float* dst, int64_t ahead, int64_t T,
                     Each&& each) {  // not forced inline: forced, the sweep measured 1.3-1.5x its time at T = 65536
  const char* at = static_cast<const char*>(x.p) + p0 * x.st * element_bytes<K>;
  const int64_t row = x.st * element_bytes<K>, blocks = Dh / 8;
  for (int64_t d0 = 0, n = 0; d0 < Dh; d0 += 8, ++n) {
    for (int64_t i = n * 8 / blocks; i < (n + 1) * 8 / blocks; ++i)
      if (ahead + i < T) prefetch_row<K>(x, ahead + i, Dh);
    __m256 r[8];
    if (valid == 8) {  // no branch per row
      for (int i = 0; i < 8; ++i) r[i] = widen8<K>(at + i * row + d0 * element_bytes<K>);
    } else {
      for (int i = 0; i < 8; ++i)
        r[i] = i < valid ? widen8<K>(at + i * row + d0 * element_bytes<K>) : _mm256_setzero_ps();
    }
    transpose8(r);
    for (int t = 0; t < 8; ++t) _mm256_store_ps(dst + (d0 + t) * 8, r[t]);
    each();
  }
}

// s[j] = Σ_d x[d] ⊙ panels[j][d], j < C (8 lanes each): Dh FMAs per key, up to 8 keys per pass over x (C < 8:
// two accumulator sets, even and odd d, so that the FMAs' latency overlaps)
template <int C, int64_t Dh>
[[gnu::always_inline]] inline void panel_dots(const float* x, const float* const (&panels)[C], __m256 (&s)[C]) {
  constexpr int J = C < 8 ? C : 8, S = C < 8 ? 2 : 1;
  for (int j0 = 0; j0 < C; j0 += J) {
    __m256 acc[S][J];
    for (int a = 0; a < S; ++a)
      for (int j = 0; j < J; ++j) acc[a][j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < Dh; d += S)
      for (int a = 0; a < S; ++a) {
        const __m256 xd = _mm256_load_ps(x + (d + a) * 8);
        for (int j = 0; j < J; ++j)
          acc[a][j] = _mm256_fmadd_ps(xd, _mm256_load_ps(panels[j0 + j] + (d + a) * 8), acc[a][j]);
      }
    for (int j = 0; j < J; ++j) s[j0 + j] = S == 2 ? _mm256_add_ps(acc[0][j], acc[S - 1][j]) : acc[0][j];
  }
}

// y = Σ_{j<m} w[j] ⊙ panels[j] (a Dh × 8 panel), transposed into 8 rows of Dh floats (row i at rows + i·Dh)
template <int C, int64_t Dh>
[[gnu::always_inline]] inline void panel_combine(const __m256* w, const float* const (&panels)[C], int m,
                                                 float* rows) {
  for (int64_t d0 = 0; d0 < Dh; d0 += 8) {
    __m256 acc[8];
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
    for (int j = 0; j < C; ++j) {
      if (j >= m) break;
      const float* at = panels[j] + d0 * 8;
      for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(w[j], _mm256_load_ps(at + t * 8), acc[t]);
    }
    transpose8(acc);
    for (int i = 0; i < 8; ++i) _mm256_store_ps(rows + i * Dh + d0, acc[i]);
  }
}

// Output rows waiting to be written (up to 3 blocks of 8 rows of Dh floats; block b's row i to row p0 + i of its
// tensor, i in [lo, hi)): next() writes one (non-temporal stores), spread over the next panel's reads. Measured in
// the driver at T = 65536, C = 8: 0.97-1.03x the time of writing them at once, within noise.
template <Kind K, int NV>
struct RowQueue {
  struct Block {
    Out o;
    int64_t p0;
    int lo, hi;
    const float* rows;
  };
  Block blocks[3];
  int size = 0, at = 0, row = 0;
  void push(const Out& o, int64_t p0, int lo, int hi, const float* rows) {
    if (lo < hi) blocks[size++] = {o, p0, lo, hi, rows};
    if (size == 1) at = 0, row = blocks[0].lo;
  }
  [[gnu::always_inline]] void next() {
    if (at == size) return;
    const Block& b = blocks[at];
    F y[NV];
    load_row<NV>(y, b.rows + row * 16 * NV);
    store_row<K, NV>(row_of<K>(b.o, b.p0 + row), y);
    if (++row == b.hi && ++at < size) row = blocks[at].lo;
    if (at == size) size = at = 0;
  }
  void flush() {
    while (size) next();
  }
};

template <int C>  // P[j] (lanes i) from the probabilities' rows, zero in lanes i >= valid
inline void probs_in(const float* probs, int64_t st, int64_t p0, int valid, __m256 (&P)[C]) {
  for (int j0 = 0; j0 < C; j0 += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) {
      const float* at = probs + (p0 + i) * st + j0;
      if (i >= valid) r[i] = _mm256_setzero_ps();
      else if constexpr (C >= 8) r[i] = _mm256_loadu_ps(at);
      else if constexpr (C == 4) r[i] = _mm256_zextps128_ps256(_mm_loadu_ps(at));
      else r[i] = _mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(at))));
    }
    transpose8(r);
    for (int t = 0; t < 8 && j0 + t < C; ++t) P[j0 + t] = r[t];
  }
}

inline void pad_panel(const float* pad, int64_t Dh, float* dst) {  // dst[d·8 + i] = pad[d] (zeros without a pad)
  for (int64_t d = 0; d < Dh; ++d) _mm256_store_ps(dst + d * 8, _mm256_set1_ps(pad ? pad[d] : 0.0f));
}

template <int C>  // ring + slot·stride of key j (step - j, slot (su - j) mod C), or `absent` before the chain's start
inline void key_panels(const float* ring, int64_t su, int64_t step, int64_t stride, const float* absent,
                       const float* (&at)[C]) {
  for (int j = 0; j < C; ++j) at[j] = j <= step ? ring + (su - j < 0 ? su - j + C : su - j) * stride : absent;
}

// sdsweep::backward_unit's work and outputs, with the lanes across chains. Rings of C steps: k, v, q, dout panels,
// and per (step, panel) the 8 queries' scale·dS_j and P_j (C vectors each).
template <Kind K, int C, int NV>
void backward_lanes(const Unit& unit, const Source& q_in, const Source& k_in, const Source& v_in,
                    const Source& dout_in, const Out& dq_in, const Out& dk_in, const Out& dv_in, float* part_r,
                    float* part_k, float* part_v) {
  constexpr int64_t Dh = 16 * NV, PD = 8 * Dh, reach = C - 1;
  const Unit u = unit;
  const Source q = q_in, k = k_in, v = v_in, dout = dout_in;
  const Out dq = dq_in, dk = dk_in, dv = dv_in;
  const int64_t D = u.D, G = u.G, panels = (G + 7) / 8, slot = panels * PD, ring = C * slot;
  const int64_t wslot = panels * C * 8, ahead = (kAheadRows + G - 1) / G;  // wslot: floats of dS (or P) per step
  float* buf = scratch(4 * ring + 2 * C * wslot + 7 * PD);
  float *ring_k = buf, *ring_v = buf + ring, *ring_q = buf + 2 * ring, *ring_g = buf + 3 * ring;
  float *ring_ds = buf + 4 * ring, *ring_p = ring_ds + C * wslot, *rows_q = ring_p + C * wslot;
  float *rows_k = rows_q + PD, *rows_v = rows_k + PD, *absent_k = rows_v + PD, *absent_v = absent_k + PD;
  float *dpk = absent_v + PD, *dpv = dpk + PD;
  RowQueue<K, NV> queue;
  pad_panel(u.pad_k, Dh, absent_k), pad_panel(u.pad_v, Dh, absent_v), pad_panel(nullptr, Dh, dpk),
      pad_panel(nullptr, Dh, dpv);
  const int64_t u_end = std::min((u.T - 1 - u.s0) / D + 1, u.u_hi + reach);  // steps with queries to visit
  const __m256 scale = _mm256_set1_ps(u.scale);
  __m256 dr[C], dr_step[C];
  for (int j = 0; j < C; ++j) dr[j] = dr_step[j] = _mm256_setzero_ps();
  // dk, dv of the keys at step w (ring slot sw), panel g, lanes [lo, hi): Σ over their queries at steps w + j, j < m
  const auto gather = [&](int64_t w, int64_t sw, int64_t g, int lo, int hi, int m) {
    const float *qp[C], *gp[C];
    __m256 wk[C], wv[C];
    for (int j = 0, s = int(sw); j < C; ++j, s = s + 1 == C ? 0 : s + 1) {
      qp[j] = ring_q + s * slot + g * PD, gp[j] = ring_g + s * slot + g * PD;
      wk[j] = _mm256_load_ps(ring_ds + s * wslot + (g * C + j) * 8);
      wv[j] = _mm256_load_ps(ring_p + s * wslot + (g * C + j) * 8);
    }
    const int64_t p0 = u.s0 + w * D + g * 8;
    panel_combine<C, Dh>(wk, qp, m, rows_k), queue.push(dk, p0, lo, hi, rows_k);
    panel_combine<C, Dh>(wv, gp, m, rows_v), queue.push(dv, p0, lo, hi, rows_v);
  };
  const auto lanes_at = [&](int64_t step, int64_t g) {  // the lanes of panel g at `step` that hold positions < T
    return int(std::clamp<int64_t>(u.T - (u.s0 + step * D + g * 8), 0, std::min<int64_t>(8, G - g * 8)));
  };
  const int64_t from_step = std::max<int64_t>(u.u_lo - reach, 0);
  for (int64_t step = from_step, su = from_step % C; step < u_end; ++step, su = su + 1 == C ? 0 : su + 1) {
    const int64_t base = u.s0 + step * D;
    const float *kp[C], *vp[C];
    key_panels<C>(ring_k, su, step, slot, absent_k, kp), key_panels<C>(ring_v, su, step, slot, absent_v, vp);
    const int present = int(std::min<int64_t>(C, step + 1));
    // every panel, those past T too (zero rows, zero dS): a key's gather may read this step of its panel
    for (int64_t g = 0; g < panels; ++g) {
      const int64_t p0 = base + g * 8, at = g * PD;
      const int valid = lanes_at(step, g);
      const int64_t pa = p0 + ahead * D;
      if (pa < u.T) {
        const char* pr = reinterpret_cast<const char*>(u.probs + pa * u.probs_st);  // 8 rows of C floats
        for (int64_t b = 0; b < 8 * C * 4; b += 64) _mm_prefetch(pr + b, _MM_HINT_T0);
      }
      const auto each = [&] { queue.next(); };
      panel_in<K>(k, p0, valid, Dh, ring_k + su * slot + at, pa, u.T, each);
      panel_in<K>(v, p0, valid, Dh, ring_v + su * slot + at, pa, u.T, each);
      if (step < u.u_lo) continue;  // a step before the unit's: its keys only
      float *qt = ring_q + su * slot + at, *gt = ring_g + su * slot + at;
      panel_in<K>(q, p0, valid, Dh, qt, pa, u.T, each), panel_in<K>(dout, p0, valid, Dh, gt, pa, u.T, each);
      queue.flush();
      const float *kg[C], *vg[C];
      for (int j = 0; j < C; ++j) kg[j] = j < present ? kp[j] + at : kp[j], vg[j] = j < present ? vp[j] + at : vp[j];
      __m256 P[C], dP[C];
      probs_in<C>(u.probs, u.probs_st, p0, valid, P);
      panel_dots<C, Dh>(gt, vg, dP);
      __m256 delta = _mm256_setzero_ps();
      for (int j = 0; j < C; ++j) delta = _mm256_fmadd_ps(P[j], dP[j], delta);
      float *ds = ring_ds + su * wslot + g * C * 8, *pw = ring_p + su * wslot + g * C * 8;
      for (int j = 0; j < C; ++j) {
        const __m256 dS = _mm256_mul_ps(P[j], _mm256_sub_ps(dP[j], delta));
        if (step < u.u_hi) dr_step[j] = _mm256_add_ps(dr_step[j], dS);
        dP[j] = _mm256_mul_ps(dS, scale);  // from here: scale·dS
        _mm256_store_ps(ds + j * 8, dP[j]), _mm256_store_ps(pw + j * 8, P[j]);
      }
      if (step < u.u_hi) {
        panel_combine<C, Dh>(dP, kg, C, rows_q), queue.push(dq, p0, 0, valid, rows_q);
        if (u.pad_k)  // the absent keys j >= present read the pads
          for (int j = present; j < C; ++j)
            for (int64_t d = 0; d < Dh; ++d) {
              const __m256 x = _mm256_load_ps(qt + d * 8), y = _mm256_load_ps(gt + d * 8);
              _mm256_store_ps(dpk + d * 8, _mm256_fmadd_ps(dP[j], x, _mm256_load_ps(dpk + d * 8)));
              _mm256_store_ps(dpv + d * 8, _mm256_fmadd_ps(P[j], y, _mm256_load_ps(dpv + d * 8)));
            }
      }
      if (step - reach >= u.u_lo && valid > 0)  // keys at step - reach whose last query is here: lanes < valid
        gather(step - reach, su + 1 == C ? 0 : su + 1, g, 0, valid, C);
    }
    if ((step & 31) == 31)  // short sums
      for (int j = 0; j < C; ++j) dr[j] = _mm256_add_ps(dr[j], dr_step[j]), dr_step[j] = _mm256_setzero_ps();
  }
  queue.flush();
  // Keys whose last query lies past T: fewer queries (zero lanes past T in the steps visited), gathered at the end.
  for (int64_t w = std::max(u.u_lo, u_end - C); w < u.u_hi; ++w)
    for (int64_t g = 0; g < panels; ++g) {
      const int valid = lanes_at(w, g), done = w + reach < u_end ? lanes_at(w + reach, g) : 0;
      if (done < valid) gather(w, w % C, g, done, valid, int(std::min<int64_t>(C, u_end - w))), queue.flush();
    }
  for (int j = 0; j < C; ++j) part_r[j] = lane_sum(_mm256_add_ps(dr[j], dr_step[j]));
  for (int64_t d = 0; d < Dh; ++d)
    part_k[d] = lane_sum(_mm256_load_ps(dpk + d * 8)), part_v[d] = lane_sum(_mm256_load_ps(dpv + d * 8));
  _mm_sfence();
}

}  // namespace sdchains
#endif
