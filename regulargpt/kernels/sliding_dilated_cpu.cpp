// Fused sliding-dilated attention on CPU, forward and backward (built by sliding_dilated_cpp.py).
//
//   query i sits at position p = query_start + i*query_step and sees the keys n_j = p - j*D, j = 0..C-1:
//   S_j = q_i . k_{n_j} * scale + r[h, j]       (n_j < 0: pad_k / pad_v, or masked out when there are no pads)
//   P = softmax_j S,   out_i = sum_j P_j v_{n_j}                          scale = 1/sqrt(Dh)
//   dP_j = dout_i . v_{n_j},  delta = sum_j P_j dP_j,  dS_j = P_j (dP_j - delta)
//   dq_i = scale sum_j dS_j k_{n_j},  dr[h, j] = sum_i dS_j,  and in gather form, over the queries i_j at n + j*D:
//   dk_n = scale sum_j dS[i_j, j] q_{i_j},  dv_n = sum_j P[i_j, j] dout_{i_j}    (n < 0: summed into dpad_k/dpad_v)
//
// Order. Position p = s + u*D lies on chain s < D at chain index u; its keys are chain indices u, u-1, ..., u-C+1 of
// the same chain. A tile takes G neighbouring chains [s0, s0 + G) and walks u, visiting the G contiguous positions
// s0 + u*D + [0, G) per step: G = D (plain position order) when the rows of C steps fit in the ring's budget, fewer
// chains when D is large. Each row of q, k, v, dout is read from memory once per tile and copied (bf16/fp16 widened,
// sliding_dilated_cpu_vec.h) into a compact ring of the last C steps, slot (u % C, c): every later use hits that
// ring, not the strided tensor (whose heads, T*Dh elements apart in a (B, H, T, Dh) layout, share cache sets). One
// row holds all H heads, H separate pieces of a (B, H, T, Dh) tensor: when G = D a tile reads whole blocks of
// positions, so it first stages kStageRows rows head by head (one contiguous run per head, stage()); otherwise the
// rows kAhead positions on are prefetched. Work units are fixed ranges of the steps of one tile, independent of the
// thread count; a unit first fills the ring with the C - 1 steps before its own. The backward does one pass per unit:
// the queries of steps [lo, hi + C - 1) (the last C - 1 steps recomputed, not owned) leave dS and P in the ring, and
// the keys of step u - C + 1 collect from them. dr and dpad are per-unit partial sums, reduced once in unit order: no
// atomics, a rerun is bit-identical, with any thread count. Out-of-range keys (u < j) only occur in a chain's first
// C - 1 steps: there the key list ends early (mask) or points at the pad row; the inner loops never test a key. The
// forward saves the probabilities P (B, H, Tq, C) in the accumulation type (a head's C floats per query adjacent: the
// sweep streams them; in (B, Tq, H, C) two heads shared each cache line, read and written twice; this layout takes
// 0.8-0.9x the sweep's time at T = 65536): the backward reads C floats per (query, head) instead of recomputing C dot
// products from a saved log-sum-exp (docs/PERFORMANCE.md measures both). Outputs of 1 MiB and more come from a pool
// of freed ones (Pool): fresh pages cost more than writing them. On AVX-512 / AVX2 CPUs the common geometries
// (every-position queries, C in {2, 4, 8, 16}, Dh in {16, 32, 64, 128}, fp32 / bf16 / fp16) run one head at a time
// instead (sliding_dilated_cpu_sweep.h, 1.7-2.9x faster at T = 65536; docs/KERNELS.md).
#include "sliding_dilated_cpu_vec.h"  // first: it sets at::vec's CPU capability

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include "sliding_dilated_cpu_pool.h"   // output buffers reused across calls
#include "sliding_dilated_cpu_sweep.h"  // the head sweep (AVX-512 or AVX2 lanes), for every-position queries
#include "sliding_dilated_cpu_row_backward.h"  // its backward, one row (query) at a time
#include "sliding_dilated_cpu_chain_lanes.h"  // its backward with lanes across chains (AVX2, D >= 8)


#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using sdvec::Acc;
constexpr int64_t kUnitRows = 256;          // positions per work unit (at least one step)
constexpr int64_t kStageRows = 32;         // rows read from memory per block, head by head (stage)
constexpr int64_t kAhead = 4;              // else rows are prefetched about this many positions ahead
// The ring, C steps x G rows: forward k, v within 256 KiB, backward k, v, q, dout within 128 KiB (measured at
// T = 65536, C = D = 8 and 16: the forward gains from G = D at C = 8, the backward loses from larger rings).
constexpr int64_t kForwardRing = 256 << 10, kBackwardRing = 128 << 10;

template <typename T>
struct Rows {  // (B, rows, H, Dh) with stride(-1) == 1; pads (B, H, Dh) use st = 0
  T* p;
  int64_t sb, st, sh;
  T* row(int64_t b, int64_t t) const { return p + b * sb + t * st; }
};

template <typename T>
Rows<T> rows_of(const at::Tensor& x) {
  T* p = x.data_ptr<std::remove_const_t<T>>();
  if (x.dim() == 3) return {p, x.stride(0), 0, x.stride(1)};
  return {p, x.stride(0), x.stride(1), x.stride(2)};
}

struct Tile {  // chains [s0, s0 + width), steps [lo, hi) of batch b
  int64_t b, s0, width, lo, hi;
};

struct Geometry {
  int64_t B, T, Tq, H, Dh, C, D, qs, step, chains, stage_steps, ahead, chain_max, G, steps, groups, parts;
  bool staged;  // G = D: each tile reads whole blocks of rows, so stage them head by head
  bool runs, narrow;  // each head's rows adjacent (q, k, v stride(1) == Dh: a step's rows are runs); 2-byte elements
  int64_t query(int64_t p) const {  // the query at position p, or -1
    const int64_t r = p - qs;
    if (step == 1) return r >= 0 && r < Tq ? r : -1;
    if (p >= T || r < 0 || r % step) return -1;
    return r / step < Tq ? r / step : -1;
  }
  int64_t per_batch() const { return groups * parts; }
  Tile tile(int64_t unit) const {
    const int64_t r = unit % per_batch(), s0 = r / parts * G, lo = r % parts * steps;
    return {unit / per_batch(), s0, std::min(G, chains - s0), lo, std::min(lo + steps, chain_max)};
  }
};

template <typename T>
struct Inputs {
  Rows<const T> q, k, v, pk, pv;
  bool pads;
};

template <typename T>
Inputs<T> inputs_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const c10::optional<at::Tensor>& pad_k, const c10::optional<at::Tensor>& pad_v) {
  Inputs<T> in{rows_of<const T>(q), rows_of<const T>(k), rows_of<const T>(v), {}, {}, pad_k.has_value()};
  if (in.pads) in.pk = rows_of<const T>(pad_k.value()), in.pv = rows_of<const T>(pad_v.value());
  return in;
}

template <typename T>  // row t, all heads, copied into buf (H, Dh) in the accumulation type: the ring's compact rows
void widen(const Rows<const T>& x, int64_t b, int64_t t, const Geometry& g, Acc<T>* buf) {
  constexpr int64_t L = sdvec::Vec<T>::size();
  for (int64_t h = 0; h < g.H; ++h) {
    const T* src = x.row(b, t) + h * x.sh;
    Acc<T>* dst = buf + h * g.Dh;
    int64_t d = 0;
    for (; d + L <= g.Dh; d += L) sdvec::load(src + d, L).store(dst + d);
    if (d < g.Dh) sdvec::load(src + d, g.Dh - d).store(dst + d, g.Dh - d);
  }
}

template <typename T>  // row t, all heads, into L2 ahead of its widen (the heads' many streams defeat the hardware's)
void prefetch(const Rows<const T>& x, int64_t b, int64_t t, const Geometry& g) {
  const int64_t bytes = g.Dh * int64_t(sizeof(T));
  for (int64_t h = 0; h < g.H; ++h) {
    const char* src = reinterpret_cast<const char*>(x.row(b, t) + h * x.sh);
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(src + at, 0, 2);
  }
}

template <typename T>  // the rows that position p + ahead*D (same chain, visited ahead*G positions later) will read
void prefetch_ahead(const Geometry& g, const Inputs<T>& in, const Rows<const T>* dout, int64_t b, int64_t p) {
  const int64_t pa = p + g.ahead * g.D, i = g.query(pa);
  if (pa >= g.T) return;
  prefetch(in.k, b, pa, g), prefetch(in.v, b, pa, g);
  if (i >= 0) prefetch(in.q, b, i, g);
  if (i >= 0 && dout) prefetch(*dout, b, i, g);
}

// The rows (all heads) of positions s0 + u*D + [0, width), u in [u0, u0 + n), into buf as row (u - u0)*G + c, in
// the input type: head by head, so that each head's rows are read as runs of `width` rows (one run when G = D) rather
// than H separate pieces per row. `queries`: the rows of the queries at those positions (none: left unwritten).
template <typename T>
Rows<const T> stage(const Rows<const T>& x, const Geometry& g, const Tile& t, int64_t u0, int64_t n, bool queries,
                    T* buf) {
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t c = 0, p = t.s0 + (u0 + s) * g.D; c < t.width && p < g.T; ++c, ++p)
        if (const int64_t r = queries ? g.query(p) : p; r >= 0)
          std::copy_n(x.row(t.b, r) + h * x.sh, g.Dh, buf + ((s * g.G + c) * g.H + h) * g.Dh);
  return {buf, 0, g.H * g.Dh, g.Dh};
}

// The key rows of the position at (u, c), from the ring block `block`: slot (u - j) % C of the last C steps, or the
// block's pad row (slot S = C*G) for u - j < 0; `su` = u % C. Returns how many: C with pads, else those with j <= u.
template <typename A>
int64_t window(const Geometry& g, int64_t u, int64_t su, int64_t c, bool pads, const A* block, const A** rows) {
  const int64_t m = pads ? g.C : std::min(g.C, u + 1), HD = g.H * g.Dh;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t slot = su - j < 0 ? su - j + g.C : su - j;
    rows[j] = block + (j <= u ? slot * g.G + c : g.C * g.G) * HD;
  }
  return m;
}

using sdpool::output;

at::Tensor output_like(const at::Tensor& x) {  // empty_like(x): x's layout when dense, else contiguous
  return x.is_non_overlapping_and_dense() ? output(x.sizes(), x.strides(), x.options()) : output(x.sizes(), x.options());
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rel_bias,
                  const c10::optional<at::Tensor>& pad_k, const c10::optional<at::Tensor>& pad_v, int64_t D,
                  int64_t qs, int64_t step, bool forward) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes(), "q (B, Tq, H, Dh), k, v (B, T, H, Dh) expected");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3), "q, k: B, H, Dh differ");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "CPU tensors expected");
  TORCH_CHECK(rel_bias.dim() == 2 && rel_bias.size(0) == q.size(2), "rel_bias (H, C) expected");
  TORCH_CHECK(pad_k.has_value() == pad_v.has_value(), "pad_k and pad_v: both or neither");
  for (const auto* pad : {&pad_k, &pad_v})
    if (pad->has_value()) {
      const at::Tensor& x = pad->value();
      TORCH_CHECK(x.dim() == 3 && x.size(0) == q.size(0) && x.size(1) == q.size(2) && x.size(2) == q.size(3) &&
                      x.scalar_type() == q.scalar_type(), "pads (B, H, Dh) in q's dtype expected");
    }
  Geometry g{q.size(0), k.size(1), q.size(1), q.size(2), q.size(3), rel_bias.size(1), D, qs, step};
  TORCH_CHECK(D >= 1 && step >= 1 && qs >= 0 && g.C >= 1, "dilation, query_step, C >= 1 and query_start >= 0 expected");
  TORCH_CHECK(g.Tq == 0 || qs + (g.Tq - 1) * step < g.T, "query positions must lie below T");
  g.chains = std::min(D, g.T);
  g.runs = q.stride(1) == g.Dh && k.stride(1) == g.Dh && v.stride(1) == g.Dh, g.narrow = q.element_size() == 2;
  g.chain_max = (g.T + D - 1) / D;
  const int64_t row_bytes = std::max<int64_t>(g.H * g.Dh * (q.scalar_type() == at::kDouble ? 8 : 4), 1);  // ring rows
  const int64_t ring_rows = forward ? 2 : 4, ring_bytes = forward ? kForwardRing : kBackwardRing;  // tensors in it
  g.G = std::clamp<int64_t>(ring_bytes / (ring_rows * g.C * row_bytes), 1, std::max<int64_t>(g.chains, 1));
  g.steps = std::max<int64_t>(kUnitRows / g.G, 1);
  g.stage_steps = std::max<int64_t>(kStageRows / g.G, 1);
  g.ahead = (kAhead + g.G - 1) / g.G;
  g.staged = g.G == g.chains;
  g.groups = (g.chains + g.G - 1) / g.G;
  g.parts = (g.chain_max + g.steps - 1) / g.steps;
  return g;
}

template <typename T>
void forward_unit(const Geometry& g, const Inputs<T>& in, const Acc<T>* r, T* out, Acc<T>* probs, int64_t unit) {
  using A = Acc<T>;
  const Tile t = g.tile(unit);
  const int64_t HD = g.H * g.Dh, HC = g.H * g.C, C = g.C, b = t.b, S = C * g.G, V = (S + 1) * HD;
  const A scale = A(1) / std::sqrt(A(g.Dh)), minus_inf = -std::numeric_limits<A>::infinity();
  std::vector<A> ring(2 * V), qbuf(HD), e(HC);  // blocks k, v: S slots (u % C, c) and the pad row
  A *ring_k = ring.data(), *ring_v = ring_k + V;
  if (in.pads) widen(in.pk, b, 0, g, ring_k + S * HD), widen(in.pv, b, 0, g, ring_v + S * HD);
  std::vector<const A*> rows(C), x(C);
  const int64_t first = std::max<int64_t>(t.lo - (C - 1), 0), block = g.stage_steps * g.G * HD;
  std::vector<T> staged(g.staged ? 3 * block : 0);
  Rows<const T> sk = in.k, sv = in.v, sq = in.q;  // staged: rows (u - u0)*G + c of `staged`
  for (int64_t u = first, su = u % C, u0 = u; u < t.hi; ++u, su = su + 1 == C ? 0 : su + 1) {
    if (g.staged && (u - first) % g.stage_steps == 0) {
      const int64_t n = std::min(g.stage_steps, t.hi - u);
      T* at = staged.data();
      u0 = u, sk = stage(in.k, g, t, u, n, false, at), sv = stage(in.v, g, t, u, n, false, at + block);
      sq = stage(in.q, g, t, u, n, true, at + 2 * block);
    }
    for (int64_t c = 0, p = t.s0 + u * g.D; c < t.width && p < g.T; ++c, ++p) {
      const int64_t slot = su * g.G + c, i = u >= t.lo ? g.query(p) : -1, row = g.staged ? (u - u0) * g.G + c : p;
      if (!g.staged) prefetch_ahead<T>(g, in, nullptr, b, p);
      widen(sk, b, row, g, ring_k + slot * HD), widen(sv, b, row, g, ring_v + slot * HD);
      if (i < 0) continue;
      widen(sq, b, g.staged ? row : i, g, qbuf.data());  // a copy even in fp32: all heads' loads in flight at once
      const int64_t m = window(g, u, su, c, in.pads, ring_k, rows.data());
      const auto pr = [&](int64_t h) { return probs + ((b * g.H + h) * g.Tq + i) * C; };  // P of (query i, head h)
      for (int64_t h = 0; h < g.H; ++h) {
        for (int64_t j = 0; j < m; ++j) x[j] = rows[j] + h * g.Dh;
        sdvec::dots<A>(qbuf.data() + h * g.Dh, x.data(), m, g.Dh, e.data() + h * C);
        A mx = minus_inf;
        for (int64_t j = 0; j < C; ++j) {
          e[h * C + j] = j < m ? e[h * C + j] * scale + r[h * C + j] : minus_inf;
          mx = std::max(mx, e[h * C + j]);
        }
        for (int64_t j = 0; j < C; ++j) e[h * C + j] -= mx;
      }
      sdvec::exp_inplace<T>(e.data(), HC);
      for (int64_t h = 0; h < g.H; ++h) {
        A sum = 0;
        for (int64_t j = 0; j < C; ++j) sum += e[h * C + j];
        for (int64_t j = 0; j < C; ++j) pr(h)[j] = e[h * C + j] / sum;
        for (int64_t j = 0; j < m; ++j) x[j] = rows[j] + V + h * g.Dh;  // the values: block v
        sdvec::combine(out + (b * g.Tq + i) * HD + h * g.Dh, pr(h), x.data(), m, g.Dh);
      }
    }
  }
  sdvec::store_fence();
}

template <typename T>
void backward_unit(const Geometry& g, const Inputs<T>& in, const Rows<const T>& dout, const Acc<T>* probs,
                   const Rows<T>& dq, const Rows<T>& dk, const Rows<T>& dv, Acc<T>* part, int64_t unit) {
  using A = Acc<T>;
  const Tile t = g.tile(unit);
  const int64_t HD = g.H * g.Dh, HC = g.H * g.C, C = g.C, b = t.b, S = C * g.G, V = (S + 1) * HD;
  const A scale = A(1) / std::sqrt(A(g.Dh));
  // blocks k, v (S slots and the pad row each), q, dout (S slots); P and dS of the queries per slot
  std::vector<A> ring(2 * V + 2 * S * HD), ring_p(S * HC), ring_ds(S * HC), dp(C), wx(C), wy(C);
  A *ring_k = ring.data(), *ring_v = ring_k + V, *ring_q = ring_v + V, *ring_do = ring_q + S * HD;
  if (in.pads) widen(in.pk, b, 0, g, ring_k + S * HD), widen(in.pv, b, 0, g, ring_v + S * HD);
  std::vector<int64_t> query(S, -1), from(C), column(C);
  A *dr = part, *dpk = part + HC, *dpv = dpk + HD;  // this unit's partial sums
  std::vector<const A*> rows(C), x(C), y(C);
  const int64_t first = std::max<int64_t>(t.lo - (C - 1), 0), end = t.hi + C - 1, block = g.stage_steps * g.G * HD;
  std::vector<T> staged(g.staged ? 4 * block : 0);
  Rows<const T> sk = in.k, sv = in.v, sq = in.q, sd = dout;  // staged: rows (u - u0)*G + c of `staged`
  for (int64_t u = first, su = u % C, u0 = u; u < end; ++u, su = su + 1 == C ? 0 : su + 1) {
    if (g.staged && (u - first) % g.stage_steps == 0) {
      const int64_t n = std::min(g.stage_steps, end - u);
      T* at = staged.data();
      u0 = u, sk = stage(in.k, g, t, u, n, false, at), sv = stage(in.v, g, t, u, n, false, at + block);
      sq = stage(in.q, g, t, u, n, true, at + 2 * block), sd = stage(dout, g, t, u, n, true, at + 3 * block);
    }
    for (int64_t c = 0, p = t.s0 + u * g.D; c < t.width; ++c, ++p) {
      const int64_t slot = su * g.G + c, i = query[slot] = u >= t.lo && p < g.T ? g.query(p) : -1;
      const int64_t row = g.staged ? (u - u0) * g.G + c : p, qrow = g.staged ? row : i;
      if (!g.staged) prefetch_ahead(g, in, &dout, b, p);
      if (p < g.T) widen(sk, b, row, g, ring_k + slot * HD), widen(sv, b, row, g, ring_v + slot * HD);
      if (i >= 0) {
        A *P = ring_p.data() + slot * HC, *dS = ring_ds.data() + slot * HC, *qa = ring_q + slot * HD, *da = ring_do + slot * HD;
        widen(sq, b, qrow, g, qa), widen(sd, b, qrow, g, da);
        const int64_t m = window(g, u, su, c, in.pads, ring_k, rows.data());
        for (int64_t h = 0; h < g.H; ++h)
          std::copy_n(probs + ((b * g.H + h) * g.Tq + i) * C, C, P + h * C);
        const bool owned = u < t.hi;
        for (int64_t h = 0; h < g.H; ++h) {
          A delta = 0;
          for (int64_t j = 0; j < m; ++j)
            delta += P[h * C + j] * (dp[j] = sdvec::dot<A>(da + h * g.Dh, rows[j] + V + h * g.Dh, g.Dh));
          for (int64_t j = 0; j < C; ++j) dS[h * C + j] = j < m ? P[h * C + j] * (dp[j] - delta) * scale : A(0);
          if (!owned) continue;
          for (int64_t j = 0; j < m; ++j) dr[h * C + j] += P[h * C + j] * (dp[j] - delta), x[j] = rows[j] + h * g.Dh;
          sdvec::combine(dq.row(b, i) + h * dq.sh, dS + h * C, x.data(), m, g.Dh);
          for (int64_t j = u + 1; in.pads && j < C; ++j) {  // the pads: keys j > u of a chain's first C - 1 steps
            sdvec::axpy<A>(dpk + h * g.Dh, dS[h * C + j], qa + h * g.Dh, g.Dh);
            sdvec::axpy<A>(dpv + h * g.Dh, P[h * C + j], da + h * g.Dh, g.Dh);
          }
        }
      }
      const int64_t w = u - (C - 1), n = p - (C - 1) * g.D;  // the key whose last query (step u) is in the ring
      if (w < t.lo || w >= t.hi || n >= g.T) continue;
      int64_t seen = 0;  // the queries of key n: steps w + j (slot su + 1 + j mod C), in j order
      for (int64_t j = 0, sj = su + 1 == C ? 0 : su + 1; j < C; ++j, sj = sj + 1 == C ? 0 : sj + 1)
        if (const int64_t s = sj * g.G + c; query[s] >= 0) from[seen] = s, column[seen++] = j;
      for (int64_t h = 0; h < g.H; ++h) {
        for (int64_t a = 0; a < seen; ++a) {
          const int64_t s = from[a], at = s * HC + h * C + column[a];
          x[a] = ring_q + s * HD + h * g.Dh, wx[a] = ring_ds[at];
          y[a] = ring_do + s * HD + h * g.Dh, wy[a] = ring_p[at];
        }
        sdvec::combine(dk.row(b, n) + h * dk.sh, wx.data(), x.data(), seen, g.Dh);
        sdvec::combine(dv.row(b, n) + h * dv.sh, wy.data(), y.data(), seen, g.Dh);
      }
    }
  }
  sdvec::store_fence();
}

// ---- the head sweep (sliding_dilated_cpu_sweep.h, AVX-512 or AVX2 + FMA + F16C builds): every-position queries (query_start 0,
// query_step 1), C in {2, 4, 8, 16}, Dh in {16, 32, 64, 128}, fp32 / bf16 / fp16; everything else takes the tiles
// above (fp64, strided queries of tree mode, other C and Dh, CPUs without AVX2).
std::atomic<bool> sweep_allowed{true};  // off: the tiles take every call (benchmarks compare the two)

#ifdef SD_SWEEP
using FwdSweep = void (*)(const sdsweep::Unit&, const sdsweep::Source&, const sdsweep::Source&,
                          const sdsweep::Source&, const sdsweep::Out&);
using BwdSweep = void (*)(const sdsweep::Unit&, const sdsweep::Source&, const sdsweep::Source&,
                          const sdsweep::Source&, const sdsweep::Source&, const sdsweep::Out&, const sdsweep::Out&,
                          const sdsweep::Out&, float*, float*, float*);

// The backward with lanes across chains (sliding_dilated_cpu_chain_lanes.h) where a unit has 8 chains or more, on
// AVX2 builds, where it was measured (T = 65536: the operator 0.79-0.81x the row backward's time at C = 16 fp32).
std::atomic<bool> lanes_allowed{true};  // off: the row backward everywhere (benchmarks compare the two)
bool chain_lanes(const Geometry& g) { return SD_LANES == 256 && lanes_allowed && std::min(g.D, g.T) >= 8; }

template <sdsweep::Kind K, int C, int NV>
std::pair<FwdSweep, BwdSweep> sweep_units(bool lanes) {
  return {&sdsweep::forward_unit<K, C, NV>,
          lanes ? &sdchains::backward_lanes<K, C, NV> : &sdsweep::backward_unit<K, C, NV>};
}

template <sdsweep::Kind K, int C>
std::pair<FwdSweep, BwdSweep> sweep_nv(int64_t nv, bool lanes) {
  switch (nv) {
    case 1: return sweep_units<K, C, 1>(lanes);
    case 2: return sweep_units<K, C, 2>(lanes);
    case 4: return sweep_units<K, C, 4>(lanes);
    case 8: return sweep_units<K, C, 8>(lanes);
    default: return {nullptr, nullptr};
  }
}

template <sdsweep::Kind K>
std::pair<FwdSweep, BwdSweep> sweep_c(int64_t C, int64_t nv, bool lanes) {
  switch (C) {
    case 2: return sweep_nv<K, 2>(nv, lanes);
    case 4: return sweep_nv<K, 4>(nv, lanes);
    case 8: return sweep_nv<K, 8>(nv, lanes);
    case 16: return sweep_nv<K, 16>(nv, lanes);
    default: return {nullptr, nullptr};
  }
}

std::pair<FwdSweep, BwdSweep> sweep_of(const Geometry& g, at::ScalarType dtype) {  // {nullptr, nullptr}: tiles
  const bool eligible = sweep_allowed && g.step == 1 && g.qs == 0 && g.Tq == g.T && g.Dh % 16 == 0;
  if (!eligible) return {nullptr, nullptr};
  const bool lanes = chain_lanes(g);
  if (dtype == at::kFloat) return sweep_c<sdsweep::Kind::f32>(g.C, g.Dh / 16, lanes);
  if (dtype == at::kBFloat16) return sweep_c<sdsweep::Kind::bf16>(g.C, g.Dh / 16, lanes);
  if (dtype == at::kHalf) return sweep_c<sdsweep::Kind::f16>(g.C, g.Dh / 16, lanes);
  return {nullptr, nullptr};
}

template <typename T>
constexpr sdsweep::Kind kind_of = std::is_same_v<T, float> ? sdsweep::Kind::f32
                                  : std::is_same_v<T, c10::BFloat16> ? sdsweep::Kind::bf16 : sdsweep::Kind::f16;

template <typename T>  // head h of batch b: rows n at .p + n·.st
sdsweep::Source source_of(const Rows<const T>& x, int64_t b, int64_t h) {
  return {x.row(b, 0) + h * x.sh, x.st};
}

template <typename T>
sdsweep::Out out_of(const Rows<T>& x, int64_t b, int64_t h) {
  return {x.row(b, 0) + h * x.sh, x.st};
}

template <typename T>  // the pad rows of (b, h) in fp32, into buf (2 Dh floats, 64-byte aligned); false: no pads
bool pads_of(const Inputs<T>& in, const Geometry& g, int64_t b, int64_t h, float* buf) {
  if (!in.pads) return false;
  for (const auto& [x, at] : {std::pair{&in.pk, buf}, std::pair{&in.pv, buf + g.Dh}}) {
    const T* row = x->row(b, 0) + h * x->sh;
    for (int64_t d = 0; d < g.Dh; d += 16) sdlanes::store(at + d, sdlanes::widen16<kind_of<T>>(row + d));
  }
  return true;
}

struct SweepPlan {  // unit = ((b·H + h)·groups + group)·parts + part: G chains, `steps` steps of them
  int64_t G, groups, steps, parts;
  int64_t per_batch(const Geometry& g) const { return g.H * groups * parts; }
};

SweepPlan sweep_plan(const Geometry& g, bool forward) {  // G: the rings of k, v (+ q, dout backward), see kStepRingBytes
  const int64_t chains = std::min(g.D, g.T), chain_max = (g.T + g.D - 1) / g.D, tensors = forward ? 2 : 4;
  // one chain's C rows in the rings (the forward's hold ring_steps<C>(G) >= C steps: at most ⌈7/G⌉ more, see kGroup)
  const int64_t step_bytes = g.C * tensors * g.Dh * 4;
  // the backward's chain lanes: whole panels of 8 chains, as many as kStepRingBytes holds (at least one). One chain
  // per unit where measured fastest (kOneChain): the forward at C = 16 and, unless a head's rows are adjacent, at
  // C = 2, 4, 8; the row backward at C = 2 unless they are adjacent, at C = 4, 8 unless they are adjacent 2-byte rows
  const bool c48 = g.C == 4 || g.C == 8;
  const bool one_chain = sdsweep::kOneChain && sdsweep::one_chain_allowed &&
                         (forward ? g.C >= 16 || ((c48 || g.C == 2) && !g.runs)
                                  : (c48 && !(g.runs && g.narrow)) || (g.C == 2 && !g.runs));
  const int64_t G = one_chain ? 1
                    : chains * step_bytes <= sdsweep::kStepRingBytes ? chains
                    : !forward && chain_lanes(g)
                        ? std::min(chains, 8 * std::max<int64_t>(1, sdsweep::kStepRingBytes / (8 * step_bytes)))
                        : std::clamp<int64_t>(sdsweep::kChainRingBytes / step_bytes, 1, chains);
  const int64_t steps = std::max<int64_t>(sdsweep::kSweepRows / G, 1);
  return {G, (chains + G - 1) / G, steps, (chain_max + steps - 1) / steps};
}

template <typename T>  // r: rel_bias (H, C), or nullptr (the backward needs none); sets b, h
sdsweep::Unit sweep_unit(const Geometry& g, const SweepPlan& plan, const Inputs<T>& in, const float* r, float* probs,
                         int64_t unit, float* pads, int64_t& b, int64_t& h) {
  const int64_t part = unit % plan.parts, group = unit / plan.parts % plan.groups;
  h = unit / plan.parts / plan.groups % g.H, b = unit / plan.parts / plan.groups / g.H;
  const bool has_pads = pads_of(in, g, b, h, pads);
  const int64_t s0 = group * plan.G, u_lo = part * plan.steps, chain_max = (g.T + g.D - 1) / g.D;
  return {g.T, g.D, s0, std::min(plan.G, std::min(g.D, g.T) - s0), u_lo, std::min(chain_max, u_lo + plan.steps),
          float(1.0 / std::sqrt(double(g.Dh))), r ? r + h * g.C : nullptr, has_pads ? pads : nullptr,
          has_pads ? pads + g.Dh : nullptr, probs + (b * g.H + h) * g.Tq * g.C, g.C};
}

template <typename T>  // the forward as head-sweep units; false: not this dtype (fp64) or not eligible
bool run_forward_sweep(const Geometry& g, const Inputs<T>& in, const at::Tensor& r, at::Tensor& out, at::Tensor& probs) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const FwdSweep sweep = sweep_of(g, out.scalar_type()).first;
    if (!sweep) return false;
    const Rows<T> o = rows_of<T>(out);
    const SweepPlan plan = sweep_plan(g, true);
    at::parallel_for(0, g.B * plan.per_batch(g), 1, [&](int64_t begin, int64_t end) {
      alignas(64) float pads[256];
      for (int64_t unit = begin, b, h; unit < end; ++unit) {
        const sdsweep::Unit u = sweep_unit(g, plan, in, r.data_ptr<float>(), probs.data_ptr<float>(), unit, pads, b, h);
        sweep(u, source_of(in.q, b, h), source_of(in.k, b, h), source_of(in.v, b, h), out_of(o, b, h));
      }
    });
    return true;
  }
}

template <typename T>  // the backward as head-sweep units, partial sums into part (units in sweep order)
bool run_backward_sweep(const Geometry& g, const Inputs<T>& in, const Rows<const T>& d_out, const at::Tensor& probs,
                        at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& part, BwdSweep sweep) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const Rows<T> gq = rows_of<T>(dq), gk = rows_of<T>(dk), gv = rows_of<T>(dv);
    const SweepPlan plan = sweep_plan(g, false);
    const int64_t HC = g.H * g.C, HD = g.H * g.Dh, width = part.size(1);
    at::parallel_for(0, part.size(0), 1, [&](int64_t begin, int64_t end) {
      alignas(64) float pads[256];
      for (int64_t unit = begin, b, h; unit < end; ++unit) {
        const sdsweep::Unit u = sweep_unit(g, plan, in, nullptr, probs.data_ptr<float>(), unit, pads, b, h);
        float* at = part.data_ptr<float>() + unit * width;
        sweep(u, source_of(in.q, b, h), source_of(in.k, b, h), source_of(in.v, b, h), source_of(d_out, b, h),
              out_of(gq, b, h), out_of(gk, b, h), out_of(gv, b, h), at + h * g.C, at + HC + h * g.Dh,
              at + HC + HD + h * g.Dh);
      }
    });
    return true;
  }
}
#endif

at::Tensor unit_stride(const at::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor rel_bias,
                                c10::optional<at::Tensor> pad_k, c10::optional<at::Tensor> pad_v, int64_t dilation,
                                int64_t query_start, int64_t query_step) {
  q = unit_stride(q), k = unit_stride(k), v = unit_stride(v);
  if (pad_k) pad_k = unit_stride(*pad_k), pad_v = unit_stride(*pad_v);
  const Geometry g = geometry(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step, true);
  const auto acc_type = at::toOpMathType(q.scalar_type());
  at::Tensor out = output({g.B, g.Tq, g.H, g.Dh}, q.options());
  at::Tensor probs = output({g.B, g.H, g.Tq, g.C}, q.options().dtype(acc_type));
  const at::Tensor r = rel_bias.to(acc_type).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "sliding_dilated_cpu_forward", [&] {
    using A = Acc<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(q, k, v, pad_k, pad_v);
#ifdef SD_SWEEP
    if (run_forward_sweep<scalar_t>(g, in, r, out, probs)) return;
#endif
    at::parallel_for(0, g.B * g.per_batch(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit)
        forward_unit<scalar_t>(g, in, r.data_ptr<A>(), out.data_ptr<scalar_t>(), probs.data_ptr<A>(), unit);
    });
  });
  return {out, probs};
}

// q, k, v the chunks [0, HD), [HD, 2HD), [2HD, 3HD) of one (B, T, 3·H·Dh) tensor's last dim, as the model splits its
// projection (every-position queries)
bool projection_chunks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.sizes() != k.sizes() || q.strides() != k.strides() || q.strides() != v.strides() || q.dim() != 4) return false;
  const int64_t HD = q.size(2) * q.size(3), es = q.element_size();
  const char *pq = static_cast<const char*>(q.data_ptr()), *pk = static_cast<const char*>(k.data_ptr());
  const char* pv = static_cast<const char*>(v.data_ptr());
  return q.stride(3) == 1 && q.stride(2) == q.size(3) && q.stride(1) == 3 * HD && q.stride(0) == q.size(1) * 3 * HD &&
         pk == pq + HD * es && pv == pq + 2 * HD * es;
}

// pack: where q, k, v are a projection's chunks (projection_chunks), dq, dk, dv come back as the same chunks of one
// (B, T, 3·H·Dh) buffer (their `_base`), so that the projection's gradient needs no concatenation
std::vector<at::Tensor> backward_impl(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor rel_bias,
                                      c10::optional<at::Tensor> pad_k, c10::optional<at::Tensor> pad_v,
                                      at::Tensor probs, int64_t dilation, int64_t query_start, int64_t query_step,
                                      bool pack) {
  dout = unit_stride(dout).to(q.scalar_type()), q = unit_stride(q), k = unit_stride(k), v = unit_stride(v);
  if (pad_k) pad_k = unit_stride(*pad_k), pad_v = unit_stride(*pad_v);
  const Geometry g = geometry(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step, false);
  const auto acc_type = at::toOpMathType(q.scalar_type());
  TORCH_CHECK(dout.sizes() == q.sizes(), "dout must have q's shape");
  probs = probs.to(acc_type).contiguous();
  TORCH_CHECK(probs.sizes() == at::IntArrayRef({g.B, g.H, g.Tq, g.C}), "probs (B, H, Tq, C) expected");
  const int64_t HC = g.H * g.C, HD = g.H * g.Dh, width = HC + 2 * HD;
  // Gradients in their input's layout when it is dense (autograd then keeps them without a copy), else contiguous;
  // with pack, a projection's chunks get the chunks of one buffer
  at::Tensor dq, dk, dv;
  if (pack && g.Tq == g.T && projection_chunks(q, k, v)) {
    const at::Tensor dqkv = output({g.B, g.T, 3 * HD}, q.options());  // (B, T, 3·H·Dh)
    const auto chunk = [&](int64_t i) { return dqkv.narrow(2, i * HD, HD).view({g.B, g.T, g.H, g.Dh}); };
    dq = chunk(0), dk = chunk(1), dv = chunk(2);
  } else {
    dq = output_like(q), dk = output_like(k), dv = output_like(v);
  }
  // per unit: dr, dpad_k, dpad_v (a sweep unit fills its head's slices); units in batch order, per_batch per batch
#ifdef SD_SWEEP
  const BwdSweep sweep = sweep_of(g, q.scalar_type()).second;
  const int64_t per_batch = sweep ? sweep_plan(g, false).per_batch(g) : g.per_batch();
#else
  const int64_t per_batch = g.per_batch();
#endif
  const int64_t units = g.B * per_batch;
  at::Tensor part = at::zeros({units, width}, q.options().dtype(acc_type));  // per unit: dr, dpad_k, dpad_v
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "sliding_dilated_cpu_backward", [&] {
    using A = Acc<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(q, k, v, pad_k, pad_v);
    const Rows<const scalar_t> d_out = rows_of<const scalar_t>(dout);
#ifdef SD_SWEEP
    if (sweep && run_backward_sweep<scalar_t>(g, in, d_out, probs, dq, dk, dv, part, sweep)) return;
#endif
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit)
        backward_unit<scalar_t>(g, in, d_out, probs.data_ptr<A>(), rows_of<scalar_t>(dq), rows_of<scalar_t>(dk),
                                rows_of<scalar_t>(dv), part.data_ptr<A>() + unit * width, unit);
    });
  });
  // The partial sums, reduced once in unit order (dr over every unit, the pads over the units of their batch).
  at::Tensor dr = at::zeros({g.H, g.C}, part.options());
  at::Tensor dpad_k = at::zeros({pad_k ? g.B : 0, g.H, g.Dh}, part.options()), dpad_v = at::zeros_like(dpad_k);
  AT_DISPATCH_FLOATING_TYPES(part.scalar_type(), "sliding_dilated_cpu_reduce", [&] {
    const scalar_t* src = part.data_ptr<scalar_t>();
    scalar_t *dst_r = dr.data_ptr<scalar_t>(), *dst_k = dpad_k.data_ptr<scalar_t>(), *dst_v = dpad_v.data_ptr<scalar_t>();
    for (int64_t unit = 0; unit < units; ++unit) {
      const scalar_t* row = src + unit * width;
      for (int64_t x = 0; x < HC; ++x) dst_r[x] += row[x];
      if (!pad_k) continue;
      const int64_t at = unit / per_batch * HD;
      for (int64_t x = 0; x < HD; ++x) dst_k[at + x] += row[HC + x], dst_v[at + x] += row[HC + HD + x];
    }
  });
  if (!pad_k) dpad_k = dpad_k.view({0}), dpad_v = dpad_v.view({0});
  dpad_k = dpad_k.to(q.scalar_type()), dpad_v = dpad_v.to(q.scalar_type());
  return {dq, dk, dv, dr, dpad_k, dpad_v};
}

std::vector<at::Tensor> backward(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor rel_bias,
                                 c10::optional<at::Tensor> pad_k, c10::optional<at::Tensor> pad_v, at::Tensor probs,
                                 int64_t dilation, int64_t query_start, int64_t query_step) {
  return backward_impl(dout, q, k, v, rel_bias, pad_k, pad_v, probs, dilation, query_start, query_step, false);
}

std::vector<at::Tensor> backward_packed(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v,
                                        at::Tensor rel_bias, c10::optional<at::Tensor> pad_k,
                                        c10::optional<at::Tensor> pad_v, at::Tensor probs, int64_t dilation,
                                        int64_t query_start, int64_t query_step) {
  return backward_impl(dout, q, k, v, rel_bias, pad_k, pad_v, probs, dilation, query_start, query_step, true);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "sliding-dilated attention forward: (out, probs)");
  m.def("backward", &backward, "sliding-dilated attention backward: (dq, dk, dv, dr, dpad_k, dpad_v)");
  m.def("backward_packed", &backward_packed,
        "the backward, with dq, dk, dv as the chunks of one (B, T, 3*H*Dh) buffer where q, k, v are such chunks");
  m.def("set_sweep", [](bool on) { sweep_allowed = on; }, "allow the head sweep (default) or force the tiles");
  m.def("set_chain_lanes", [](bool on) {
#ifdef SD_SWEEP
    lanes_allowed = on;
#endif
  }, "allow the sweep's backward with lanes across chains (default) or force its row backward");
  m.def("set_step_pairs", [](bool on) {
#ifdef SD_SWEEP
    sdsweep::step_pairs_allowed = on;
#endif
  }, "allow the sweep's forward and row backward to take a chain's steps in pairs (default) or every query alone");
  m.def("set_one_chain", [](bool on) {
#ifdef SD_SWEEP
    sdsweep::one_chain_allowed = on;
#endif
  }, "allow the sweep's one-chain units where measured faster (default) or apply the ring rule everywhere");
  m.def("sweep_available", [] {
#ifdef SD_SWEEP
    return true;
#else
    return false;
#endif
  }, "whether this build has the head sweep (AVX-512 or AVX2 lanes)");
  m.def("sweep_lanes", [] {
#ifdef SD_SWEEP
    return SD_LANES;
#else
    return 0;
#endif
  }, "the head sweep's register width in bits: 512 (AVX-512), 256 (AVX2), 0 (no sweep)");
}
