// The head sweep's row backward (sliding_dilated_cpu_sweep.h has its units, rings, rows and the formulas): one work
// unit's dq, dk, dv rows and its partial sums of dr and the pads' gradients, queries one at a time or a chain's
// steps in pairs. sliding_dilated_cpu.cpp takes it where the lanes across chains (sliding_dilated_cpu_chain_lanes.h)
// do not apply: AVX-512 builds, and AVX2 units of fewer than 8 chains.
#pragma once

#include "sliding_dilated_cpu_sweep.h"

#ifdef SD_SWEEP

namespace sdsweep {

// This unit's partial sums, written (not accumulated): dr at part_r (C floats), dpad_k, dpad_v at part_k, part_v (Dh).
// The queries of the C - 1 steps after u_hi are recomputed (dS only): the last keys gather without another unit.
// Like the forward it takes a chain's steps u, u + 1 together once all their keys are present (and both are owned,
// or both recomputed): their dP (scores_pair over v rows), dq (combine_pair over k rows) and the gathers of keys
// u - C + 1 and u - C + 2 (combine_pair over the C + 1 q, dout rows of steps u - C + 1 ... u + 1) read each shared
// row once. dr adds step u + 1's dS after all of step u's, so every sum keeps its order and the gradients their
// bits. The rings hold R = C + 1 steps: step u + 1's rows arrive before key u - C + 1 is gathered.
template <Kind K, int C, int NV>
void backward_unit(const Unit& u, const Source& q, const Source& k, const Source& v, const Source& dout,
                   const Out& dq, const Out& dk, const Out& dv, float* part_r, float* part_k, float* part_v) {
  constexpr int64_t Dh = 16 * NV, reach = C - 1, R = C + 1;
  const M all = first(C);
  const int64_t D = u.D, G = u.G, ring = R * G * Dh, ahead = (kAheadRows + G - 1) / G;
  float* buf = scratch(4 * ring + 2 * R * G * 16 + G * 16);
  float *ring_k = buf, *ring_v = buf + ring, *ring_q = buf + 2 * ring, *ring_g = buf + 3 * ring;
  float *dS_of = buf + 4 * ring, *P_of = dS_of + R * G * 16;  // scale·dS and P of the queries per slot, 16 lanes
  float* dS_next = P_of + R * G * 16;                         // dS of a pair's step u + 1 per chain, for dr
  alignas(64) float zero_row[Dh] = {}, w[16], pw[16];
  const float *absent_k = u.pad_k ? u.pad_k : zero_row, *absent_v = u.pad_v ? u.pad_v : zero_row;
  const int64_t u_end = std::min((u.T - 1 - u.s0) / D + 1, u.u_hi + reach);  // steps with queries to visit
  const F scale = set1(u.scale);
  F dr = zero(), dr_step = zero(), dpk[NV], dpv[NV];
  for (int i = 0; i < NV; ++i) dpk[i] = dpv[i] = zero();
  const auto softmax_grad = [all](F P, F dP) {  // dS = P ⊙ (dP - Σ_j P_j dP_j), lanes j < C
    return maskz(all, mul(P, sub(dP, set1(reduce_add(all, mul(P, dP))))));
  };
  // dk_n, dv_n of key n (step w, chain c; sw = w mod R) from its queries at steps w + j, j < m
  const auto gather = [&](int64_t n, int64_t sw, int64_t c, int m) {
    const float *qr[C], *gr[C];
    alignas(64) float wk[16], wv[16];
    for (int64_t j = 0, s = sw; j < C; ++j, s = s + 1 == R ? 0 : s + 1) {
      const int64_t slot = s * G + c;
      qr[j] = ring_q + slot * Dh, gr[j] = ring_g + slot * Dh, wk[j] = dS_of[slot * 16 + j], wv[j] = P_of[slot * 16 + j];
    }
    F y[NV];
    combine<C, NV>(y, wk, qr, m), store_row<K, NV>(row_of<K>(dk, n), y);
    combine<C, NV>(y, wv, gr, m), store_row<K, NV>(row_of<K>(dv, n), y);
  };
  // keys n (step w, slot step sw) and n + D (step w + 1) from the queries at steps w ... w + C (all present):
  // rows[i] of step w + i; wk1, wv1 weigh them for key n (combine_pair's y1), wk0, wv0 for key n + D (its y0)
  const auto gather_pair = [&](int64_t n, int64_t sw, int64_t c) {
    const float *qr[C + 1], *gr[C + 1];
    alignas(64) float wk0[16], wk1[16], wv0[16], wv1[16];
    for (int64_t i = 0, s = sw; i <= C; ++i, s = s + 1 == R ? 0 : s + 1) {
      const int64_t slot = s * G + c;
      qr[i] = ring_q + slot * Dh, gr[i] = ring_g + slot * Dh;
      if (i < C) wk1[i] = dS_of[slot * 16 + i], wv1[i] = P_of[slot * 16 + i];
      if (i > 0) wk0[i - 1] = dS_of[slot * 16 + i - 1], wv0[i - 1] = P_of[slot * 16 + i - 1];
    }
    F y0[NV], y1[NV];
    combine_pair<C, NV>(y0, y1, wk0, wk1, qr);
    store_row<K, NV>(row_of<K>(dk, n + D), y0), store_row<K, NV>(row_of<K>(dk, n), y1);
    combine_pair<C, NV>(y0, y1, wv0, wv1, gr);
    store_row<K, NV>(row_of<K>(dv, n + D), y0), store_row<K, NV>(row_of<K>(dv, n), y1);
  };
  const bool pairs = step_pairs_allowed.load(std::memory_order_relaxed);
  const int64_t from_step = std::max<int64_t>(u.u_lo - reach, 0);
  for (int64_t step = from_step, su = from_step % R, next; step < u_end; su = (su + next - step) % R, step = next) {
    const int64_t base = u.s0 + step * D, width = std::min(G, u.T - base);
    if (width <= 0) break;
    const bool own = step < u.u_hi;  // this step's dq and dr are the unit's
    const bool pair = pairs && step >= u.u_lo && step >= reach && step + 1 < u_end && base + D < u.T &&
                      (step + 1 < u.u_hi || !own);
    const int64_t width1 = pair ? std::min(G, u.T - base - D) : 0, s1 = su + 1 == R ? 0 : su + 1;
    const int64_t s_key = (su + R - reach) % R;  // the slot step of key step - reach (step + 1 - reach: the next)
    next = step + (pair ? 2 : 1);
    for (int64_t c = 0; c < width; ++c) {
      const int64_t p = base + c, slot = su * G + c, slot1 = s1 * G + c;
      const bool both = c < width1;
      for (int64_t pa = p + ahead * D, e = pa + (both ? D : 0); pa <= e && pa < u.T; pa += D) {
        prefetch_row<K>(q, pa, Dh), prefetch_row<K>(k, pa, Dh), prefetch_row<K>(v, pa, Dh);
        prefetch_row<K>(dout, pa, Dh);
        _mm_prefetch(reinterpret_cast<const char*>(u.probs + pa * u.probs_st), _MM_HINT_T0);
      }
      widen_row<K>(k, p, Dh, ring_k + slot * Dh), widen_row<K>(v, p, Dh, ring_v + slot * Dh);
      if (both) widen_row<K>(k, p + D, Dh, ring_k + slot1 * Dh), widen_row<K>(v, p + D, Dh, ring_v + slot1 * Dh);
      if (step < u.u_lo) continue;  // a step before the unit's: its keys only
      widen_row<K>(q, p, Dh, ring_q + slot * Dh), widen_row<K>(dout, p, Dh, ring_g + slot * Dh);
      if (both) widen_row<K>(q, p + D, Dh, ring_q + slot1 * Dh), widen_row<K>(dout, p + D, Dh, ring_g + slot1 * Dh);
      const F P = load_first<C>(u.probs + p * u.probs_st);
      F g[NV], y[NV];
      load_row<NV>(g, ring_g + slot * Dh);
      int64_t slots[C];
      const float *kr[C], *vr[C];
      const int present = key_slots<C>(step, su, c, G, R, slots), m = u.pad_k ? C : present;
      rows_of<C>(ring_v, Dh, slots, absent_v, vr);
      if (both) {  // queries p (step) and p + D (step + 1): all keys present, no pads read
        const F P1 = load_first<C>(u.probs + (p + D) * u.probs_st);
        F g1[NV], dP, dP1, y1[NV];
        load_row<NV>(g1, ring_g + slot1 * Dh);
        const float* rows[C + 1];  // rows[i]: the row of step + 1 - i
        rows[0] = ring_v + slot1 * Dh;
        for (int j = 0; j < C; ++j) rows[j + 1] = vr[j];
        scores_pair<C, NV>(g, g1, rows, dP, dP1);
        const F dS = softmax_grad(P, dP), dS1 = softmax_grad(P1, dP1);
        store(dS_of + slot * 16, mul(dS, scale)), store(P_of + slot * 16, P);
        store(dS_of + slot1 * 16, mul(dS1, scale)), store(P_of + slot1 * 16, P1);
        if (own) {
          dr_step = add(dr_step, dS), store(dS_next + c * 16, dS1);
          rows[0] = ring_k + slot1 * Dh;
          for (int j = 0; j < C; ++j) rows[j + 1] = ring_k + slots[j] * Dh;
          combine_pair<C, NV>(y, y1, dS_of + slot * 16, dS_of + slot1 * 16, rows);
          store_row<K, NV>(row_of<K>(dq, p), y), store_row<K, NV>(row_of<K>(dq, p + D), y1);
        }
        if (step - reach >= u.u_lo) gather_pair(p - reach * D, s_key, c);  // the last queries of both keys
        else if (step + 1 - reach >= u.u_lo) gather(p + D - reach * D, s_key + 1 == R ? 0 : s_key + 1, c, C);
        continue;
      }
      const F dS = softmax_grad(P, scores<C, NV>(g, vr));
      const F dSs = mul(dS, scale);
      store(dS_of + slot * 16, dSs), store(P_of + slot * 16, P);
      if (own) {
        dr_step = add(dr_step, dS);
        store(w, dSs);
        rows_of<C>(ring_k, Dh, slots, absent_k, kr);
        combine<C, NV>(y, w, kr, m), store_row<K, NV>(row_of<K>(dq, p), y);
        if (u.pad_k && present < C) {  // the absent keys j >= present read the pads
          F x[NV];
          load_row<NV>(x, ring_q + slot * Dh);
          store(pw, P);
          for (int j = present; j < C; ++j)
            for (int i = 0; i < NV; ++i)
              dpk[i] = fmadd(set1(w[j]), x[i], dpk[i]),
              dpv[i] = fmadd(set1(pw[j]), g[i], dpv[i]);
        }
      }
      if (step - reach >= u.u_lo) gather(p - reach * D, s_key, c, C);  // its last query: p
    }
    if ((step & 31) == 31) dr = add(dr, dr_step), dr_step = zero();  // short sums
    if (pair) {  // step + 1's dS, in the order of lone steps
      if (own)
        for (int64_t c = 0; c < width1; ++c) dr_step = add(dr_step, load(dS_next + c * 16));
      if (((step + 1) & 31) == 31) dr = add(dr, dr_step), dr_step = zero();
    }
  }
  // Keys whose last query lies past T (or past the visited steps): fewer queries, gathered at the end.
  for (int64_t step = std::max(u.u_lo, u_end - C); step < u.u_hi; ++step)
    for (int64_t c = 0; c < G; ++c) {
      const int64_t n = u.s0 + step * D + c;
      if (n >= u.T || (n + reach * D < u.T && step + reach < u_end)) continue;  // absent, or gathered in the loop
      gather(n, step % R, c, int(std::min<int64_t>(C, (u.T - 1 - n) / D + 1)));
    }
  dr = add(dr, dr_step);
  store_first<C>(part_r, dr);
  for (int i = 0; i < NV; ++i) storeu(part_k + 16 * i, dpk[i]), storeu(part_v + 16 * i, dpv[i]);
  _mm_sfence();
}

}  // namespace sdsweep
#endif
