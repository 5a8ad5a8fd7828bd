// Fused sliding-dilated attention on CPU, forward and backward (built by sliding_dilated_cpp.py).
//
//   query i sits at position p = query_start + i*query_step and sees the keys n_j = p - j*D, j = 0..C-1:
//   S_j = q_i . k_{n_j} * scale + r[h, j]       (n_j < 0: pad_k / pad_v, or masked out when there are no pads)
//   P = softmax_j S,   out_i = sum_j P_j v_{n_j}                          scale = 1/sqrt(Dh)
//   dP_j = dout_i . v_{n_j},  delta = sum_j P_j dP_j,  dS_j = P_j (dP_j - delta)
//   dq_i = scale sum_j dS_j k_{n_j},  dr[h, j] = sum_i dS_j,  and in gather form, over the queries i_j at n + j*D:
//   dk_n = scale sum_j dS[i_j, j] q_{i_j},  dv_n = sum_j P[i_j, j] dout_{i_j}    (n < 0: summed into dpad_k/dpad_v)
//
// Order. Positions are visited in folded order: chain s = {s, s+D, s+2D, ...}, chain index u = (p - s)/D, so the
// keys of chain index u are chain indices u, u-1, ..., u-C+1, held in a ring of C rows (converted to the
// accumulation type once), and each row of q, k, v, dout is read from memory about once whatever D. One row holds
// all H heads. Work units are fixed ranges of kUnitRows rows of the order (b, s, u), independent of the thread
// count. The backward does one pass per unit: the queries u in [lo, hi + C - 1) (the last C - 1 are recomputed, not
// owned) leave dS and P in the ring, and key u - C + 1 collects from them. dr and dpad are per-unit partial sums,
// reduced once in unit order: no atomics, a rerun is bit-identical, with any thread count.
// The forward saves the probabilities P (B, Tq, H, C) in the accumulation type (with C <= 8 a read of C floats
// per (query, head) is cheaper than recomputing C dot products from the log-sum-exp).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <sys/mman.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kUnitRows = 256;
constexpr int kLanes = 16;  // partial sums of a dot product: a fixed summation order whatever the alignment
constexpr int64_t kAhead = 4;  // rows of the chain prefetched ahead (the hardware does not follow a stride of D rows)

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T part[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) part[l] += a[d + l] * b[d + l];
  T s = 0;
  for (; d < n; ++d) s += a[d] * b[d];
  for (int width = kLanes / 2; width > 0; width /= 2)  // a tree: a short dependency chain, still a fixed order
    for (int l = 0; l < width; ++l) part[l] += part[l + width];
  return s + part[0];
}

template <typename T>
inline void axpy(T* y, T alpha, const T* x, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

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

template <typename A>
struct View {  // one row, all heads, in the accumulation type: head h at p + h * hs
  const A* p = nullptr;
  int64_t hs = 0;
  const A* head(int64_t h) const { return p + h * hs; }
};

struct Geometry {
  int64_t B, T, Tq, H, Dh, C, D, qs, step, chains, chain_max, units_per_batch;
  int64_t chain_len(int64_t s) const { return (T - s + D - 1) / D; }
  int64_t query(int64_t p) const {  // the query at position p, or -1
    int64_t r = p - qs;
    if (step == 1) return r >= 0 && r < Tq ? r : -1;
    if (r < 0 || r % step) return -1;
    return r / step < Tq ? r / step : -1;
  }
  template <typename F>
  void for_each_segment(int64_t unit, const F& f) const {  // unit's segments (chain s, chain indices [lo, hi))
    int64_t f0 = unit * kUnitRows, f1 = std::min(f0 + kUnitRows, chains * chain_max);
    for (int64_t s = f0 / chain_max; s * chain_max < f1; ++s) {
      int64_t lo = std::max<int64_t>(f0 - s * chain_max, 0);
      int64_t hi = std::min({f1 - s * chain_max, chain_max, chain_len(s)});
      if (lo < hi) f(s, lo, hi);
    }
  }
};

// Conversions that vectorise: bf16 <-> fp32 by bit shifts (round to nearest even, NaN kept), fp16 by F16C.
template <typename T, typename A>
inline void widen(const T* src, A* dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
    for (int64_t d = 0; d < n; ++d) {
      const uint32_t wide = uint32_t(bits[d]) << 16;
      std::memcpy(dst + d, &wide, 4);
    }
#if defined(__F16C__)
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
      _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
    for (; d < n; ++d) dst[d] = static_cast<A>(src[d]);
#endif
  } else {
    for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<A>(src[d]);
  }
}

template <typename T, typename A>
inline void narrow(const A* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint16_t* bits = reinterpret_cast<uint16_t*>(dst);
    for (int64_t d = 0; d < n; ++d) {
      uint32_t x;
      std::memcpy(&x, src + d, 4);
      const uint32_t rounded = (x + 0x7FFF + ((x >> 16) & 1)) >> 16;
      bits[d] = uint16_t((x & 0x7FFFFFFF) > 0x7F800000 ? 0x7FC0 : rounded);  // integer NaN test: vectorises
    }
#if defined(__F16C__)
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + d), _mm256_cvtps_ph(_mm256_loadu_ps(src + d), _MM_FROUND_TO_NEAREST_INT));
    for (; d < n; ++d) dst[d] = static_cast<T>(src[d]);
#endif
  } else {
    for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<T>(src[d]);
  }
}

template <typename A, typename T>
View<A> load(const T* src, int64_t hs, const Geometry& g, A* buf) {  // in place when T is A, else converted
  if constexpr (std::is_same_v<A, T>) {
    return {src, hs};
  } else {
    for (int64_t h = 0; h < g.H; ++h) widen(src + h * hs, buf + h * g.Dh, g.Dh);
    return {buf, g.Dh};
  }
}

template <typename T>
inline void prefetch(const T* src, int64_t hs, const Geometry& g) {  // one row, all heads, into the cache
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t byte = 0; byte < g.Dh * int64_t(sizeof(T)); byte += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(src + h * hs) + byte);
}

at::Tensor hugepages(at::Tensor x) {
  // Fresh memory, written once: ask for transparent huge pages (4 KiB page faults cost as much as the kernel here).
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(x.data_ptr()) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(x.data_ptr()) + x.nbytes()) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice only
  return x;
}

template <typename A>  // key j of chain index u: ring slot of u - j (u's is `slot`), or `pad` (nullptr: masked)
void window(const std::vector<View<A>>& ring, int64_t u, int64_t slot, const View<A>* pad, const View<A>** out) {
  const int64_t C = int64_t(ring.size());
  for (int64_t j = 0, sl = slot; j < C; ++j, sl = sl ? sl - 1 : C - 1) out[j] = j <= u ? &ring[sl] : pad;
}

template <typename T, typename A>  // outputs are written once and not read here: non-temporal stores skip the
void store(T* dst, const A* src, int64_t n) {  // read-for-ownership of their cache lines
  int64_t d = 0;
#if defined(__SSE2__)
  constexpr int64_t kPer = 16 / sizeof(T);
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    for (; d + kPer <= n; d += kPer) {
      alignas(16) T lane[kPer];
      narrow(src + d, lane, kPer);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + d), _mm_load_si128(reinterpret_cast<const __m128i*>(lane)));
    }
#endif
  for (; d < n; ++d) dst[d] = static_cast<T>(src[d]);
}

template <typename T, typename A>  // dst = sum_j w[j] x[j] over the x[j] that are not nullptr, in j order
void combine(T* dst, const A* w, const A* const* x, int64_t m, int64_t n) {
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {  // the accumulator stays in registers, dst is written once
    A acc[kLanes] = {};
    for (int64_t j = 0; j < m; ++j) {
      if (!x[j]) continue;
      const A *xj = x[j] + d, wj = w[j];
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) acc[l] += wj * xj[l];
    }
    store(dst + d, acc, kLanes);
  }
  for (; d < n; ++d) {
    A acc = 0;
    for (int64_t j = 0; j < m; ++j)
      if (x[j]) acc += w[j] * x[j][d];
    dst[d] = static_cast<T>(acc);
  }
}

inline void store_fence() {  // the non-temporal stores of a work unit, visible before it returns
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rel_bias,
                  const c10::optional<at::Tensor>& pad_k, const c10::optional<at::Tensor>& pad_v, int64_t D,
                  int64_t qs, int64_t step) {
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
  Geometry g{q.size(0), k.size(1), q.size(1), q.size(2), q.size(3), rel_bias.size(1), D, qs, step, 0, 0, 0};
  TORCH_CHECK(D >= 1 && step >= 1 && qs >= 0 && g.C >= 1, "dilation, query_step, C >= 1 and query_start >= 0 expected");
  TORCH_CHECK(g.Tq == 0 || qs + (g.Tq - 1) * step < g.T, "query positions must lie below T");
  g.chains = std::min(D, g.T);
  g.chain_max = g.T > 0 ? g.chain_len(0) : 0;
  g.units_per_batch = (g.chains * g.chain_max + kUnitRows - 1) / kUnitRows;
  return g;
}

at::Tensor unit_stride(const at::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

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

template <typename T>
void forward_unit(const Geometry& g, const Inputs<T>& in, const at::opmath_type<T>* r, T* out,
                  at::opmath_type<T>* probs, int64_t unit) {
  using A = at::opmath_type<T>;
  const int64_t HD = g.H * g.Dh, C = g.C, b = unit / g.units_per_batch;
  const A scale = A(1) / std::sqrt(A(g.Dh)), minus_inf = -std::numeric_limits<A>::infinity();
  std::vector<A> buf((2 * C + 3) * HD + C);
  A *ring_k = buf.data(), *ring_v = ring_k + C * HD, *qbuf = ring_v + C * HD, *pad_buf = qbuf + HD;
  A* e = pad_buf + 2 * HD;
  std::vector<View<A>> kr(C), vr(C);
  std::vector<const View<A>*> keys(C), vals(C);
  std::vector<const A*> x(C);
  View<A> pk, pv;
  if (in.pads) pk = load(in.pk.row(b, 0), in.pk.sh, g, pad_buf), pv = load(in.pv.row(b, 0), in.pv.sh, g, pad_buf + HD);
  g.for_each_segment(unit % g.units_per_batch, [&](int64_t s, int64_t lo, int64_t hi) {
    for (int64_t u = std::max<int64_t>(lo - (C - 1), 0); u < hi; ++u) {
      const int64_t p = s + u * g.D, slot = u % C, ahead = p + kAhead * g.D;
      if (u + kAhead < hi) {
        prefetch(in.k.row(b, ahead), in.k.sh, g), prefetch(in.v.row(b, ahead), in.v.sh, g);
        if (const int64_t i = g.query(ahead); i >= 0) prefetch(in.q.row(b, i), in.q.sh, g);
      }
      kr[slot] = load(in.k.row(b, p), in.k.sh, g, ring_k + slot * HD);
      vr[slot] = load(in.v.row(b, p), in.v.sh, g, ring_v + slot * HD);
      const int64_t i = u >= lo ? g.query(p) : -1;
      if (i < 0) continue;
      const View<A> qv = load(in.q.row(b, i), in.q.sh, g, qbuf);
      window(kr, u, slot, in.pads ? &pk : nullptr, keys.data()), window(vr, u, slot, in.pads ? &pv : nullptr, vals.data());
      T* o = out + (b * g.Tq + i) * HD;
      A* pr = probs + (b * g.Tq + i) * g.H * C;
      for (int64_t h = 0; h < g.H; ++h) {
        A mx = minus_inf, sum = 0;
        for (int64_t j = 0; j < C; ++j) {
          e[j] = keys[j] ? dot(qv.head(h), keys[j]->head(h), g.Dh) * scale + r[h * C + j] : minus_inf;
          mx = std::max(mx, e[j]);
        }
        for (int64_t j = 0; j < C; ++j) sum += (e[j] = std::exp(e[j] - mx));
        for (int64_t j = 0; j < C; ++j) pr[h * C + j] = e[j] / sum, x[j] = vals[j] ? vals[j]->head(h) : nullptr;
        combine(o + h * g.Dh, pr + h * C, x.data(), C, g.Dh);
      }
    }
  });
  store_fence();
}

template <typename T>
void backward_unit(const Geometry& g, const Inputs<T>& in, const Rows<const T>& dout,
                   const at::opmath_type<T>* probs, const Rows<T>& dq, const Rows<T>& dk, const Rows<T>& dv,
                   at::opmath_type<T>* part, int64_t unit) {
  using A = at::opmath_type<T>;
  const int64_t HD = g.H * g.Dh, HC = g.H * g.C, C = g.C, b = unit / g.units_per_batch;
  const A scale = A(1) / std::sqrt(A(g.Dh));
  std::vector<A> buf((4 * C + 2) * HD + 2 * C * HC + C);
  A *ring = buf.data(), *pad_buf = ring + 4 * C * HD, *ring_p = pad_buf + 2 * HD, *ring_ds = ring_p + C * HC;
  A* dp = ring_ds + C * HC;
  A *dr = part, *dpk = part + HC, *dpv = dpk + HD;  // this unit's partial sums
  std::vector<View<A>> kr(C), vr(C), qr(C), dor(C);
  std::vector<const View<A>*> keys(C), vals(C);
  std::vector<const A*> x(C), y(C);
  std::vector<A> wx(C), wy(C);
  std::vector<int64_t> query(C, -1);
  View<A> pk, pv;
  if (in.pads) pk = load(in.pk.row(b, 0), in.pk.sh, g, pad_buf), pv = load(in.pv.row(b, 0), in.pv.sh, g, pad_buf + HD);
  g.for_each_segment(unit % g.units_per_batch, [&](int64_t s, int64_t lo, int64_t hi) {
    const int64_t len = g.chain_len(s);
    for (int64_t u = std::max<int64_t>(lo - (C - 1), 0); u < hi + C - 1; ++u) {
      const int64_t p = s + u * g.D, slot = u % C;
      A *slot_buf = ring + slot * 4 * HD, *P = ring_p + slot * HC, *dS = ring_ds + slot * HC;
      query[slot] = -1;
      if (const int64_t ahead = p + kAhead * g.D; u + kAhead < std::min(len, hi + C - 1)) {
        prefetch(in.k.row(b, ahead), in.k.sh, g), prefetch(in.v.row(b, ahead), in.v.sh, g);
        if (const int64_t i = g.query(ahead); i >= 0) prefetch(in.q.row(b, i), in.q.sh, g), prefetch(dout.row(b, i), dout.sh, g);
      }
      if (u < len) {
        kr[slot] = load(in.k.row(b, p), in.k.sh, g, slot_buf);
        vr[slot] = load(in.v.row(b, p), in.v.sh, g, slot_buf + HD);
        query[slot] = u >= lo ? g.query(p) : -1;
      }
      if (const int64_t i = query[slot]; i >= 0) {
        qr[slot] = load(in.q.row(b, i), in.q.sh, g, slot_buf + 2 * HD);
        dor[slot] = load(dout.row(b, i), dout.sh, g, slot_buf + 3 * HD);
        std::copy(probs + (b * g.Tq + i) * HC, probs + (b * g.Tq + i + 1) * HC, P);
        const bool owned = u < hi;
        window(kr, u, slot, in.pads ? &pk : nullptr, keys.data()), window(vr, u, slot, in.pads ? &pv : nullptr, vals.data());
        for (int64_t h = 0; h < g.H; ++h) {
          const A *qh = qr[slot].head(h), *doh = dor[slot].head(h);
          A delta = 0;
          for (int64_t j = 0; j < C; ++j) {
            dp[j] = vals[j] ? dot(doh, vals[j]->head(h), g.Dh) : A(0);
            delta += P[h * C + j] * dp[j];
          }
          for (int64_t j = 0; j < C; ++j) dS[h * C + j] = P[h * C + j] * (dp[j] - delta) * scale;
          if (!owned) continue;
          for (int64_t j = 0; j < C; ++j) {
            const A ds = dS[h * C + j];
            dr[h * C + j] += P[h * C + j] * (dp[j] - delta);
            x[j] = keys[j] ? keys[j]->head(h) : nullptr;
            if (j > u && in.pads) {
              axpy(dpk + h * g.Dh, ds, qh, g.Dh);
              axpy(dpv + h * g.Dh, P[h * C + j], doh, g.Dh);
            }
          }
          combine(dq.row(b, i) + h * dq.sh, dS + h * C, x.data(), C, g.Dh);
        }
      }
      const int64_t w = u - (C - 1);  // the key whose last query (w + C - 1 = u) is now in the ring
      if (w < lo || w >= hi) continue;
      T *dk_row = dk.row(b, s + w * g.D), *dv_row = dv.row(b, s + w * g.D);
      for (int64_t h = 0; h < g.H; ++h) {
        for (int64_t j = 0, from = slot + 1 == C ? 0 : slot + 1; j < C; ++j, from = from + 1 == C ? 0 : from + 1) {
          const bool seen = query[from] >= 0;  // `from`: the slot of chain index w + j
          x[j] = seen ? qr[from].head(h) : nullptr, wx[j] = seen ? ring_ds[from * HC + h * C + j] : A(0);
          y[j] = seen ? dor[from].head(h) : nullptr, wy[j] = seen ? ring_p[from * HC + h * C + j] : A(0);
        }
        combine(dk_row + h * dk.sh, wx.data(), x.data(), C, g.Dh);
        combine(dv_row + h * dv.sh, wy.data(), y.data(), C, g.Dh);
      }
    }
  });
  store_fence();
}

std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor rel_bias,
                                c10::optional<at::Tensor> pad_k, c10::optional<at::Tensor> pad_v, int64_t dilation,
                                int64_t query_start, int64_t query_step) {
  q = unit_stride(q), k = unit_stride(k), v = unit_stride(v);
  if (pad_k) pad_k = unit_stride(*pad_k), pad_v = unit_stride(*pad_v);
  const Geometry g = geometry(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step);
  const auto acc_type = at::toOpMathType(q.scalar_type());
  at::Tensor out = hugepages(at::empty({g.B, g.Tq, g.H, g.Dh}, q.options()));
  at::Tensor probs = at::empty({g.B, g.Tq, g.H, g.C}, q.options().dtype(acc_type));
  const at::Tensor r = rel_bias.to(acc_type).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "sliding_dilated_cpu_forward", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(q, k, v, pad_k, pad_v);
    at::parallel_for(0, g.B * g.units_per_batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit)
        forward_unit<scalar_t>(g, in, r.data_ptr<A>(), out.data_ptr<scalar_t>(), probs.data_ptr<A>(), unit);
    });
  });
  return {out, probs};
}

std::vector<at::Tensor> backward(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor rel_bias,
                                 c10::optional<at::Tensor> pad_k, c10::optional<at::Tensor> pad_v, at::Tensor probs,
                                 int64_t dilation, int64_t query_start, int64_t query_step) {
  dout = unit_stride(dout).to(q.scalar_type()), q = unit_stride(q), k = unit_stride(k), v = unit_stride(v);
  if (pad_k) pad_k = unit_stride(*pad_k), pad_v = unit_stride(*pad_v);
  const Geometry g = geometry(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step);
  const auto acc_type = at::toOpMathType(q.scalar_type());
  TORCH_CHECK(dout.sizes() == q.sizes(), "dout must have q's shape");
  probs = probs.to(acc_type).contiguous();
  TORCH_CHECK(probs.sizes() == at::IntArrayRef({g.B, g.Tq, g.H, g.C}), "probs (B, Tq, H, C) expected");
  // Gradients in their input's layout when it is dense (autograd then keeps them without a copy), else contiguous.
  at::Tensor dq = hugepages(at::empty_like(q)), dk = hugepages(at::empty_like(k)), dv = hugepages(at::empty_like(v));
  const int64_t HC = g.H * g.C, HD = g.H * g.Dh, units = g.B * g.units_per_batch, width = HC + 2 * HD;
  at::Tensor part = at::zeros({units, width}, q.options().dtype(acc_type));  // per unit: dr, dpad_k, dpad_v
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "sliding_dilated_cpu_backward", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(q, k, v, pad_k, pad_v);
    const Rows<const scalar_t> d_out = rows_of<const scalar_t>(dout);
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
      const int64_t at = unit / g.units_per_batch * HD;
      for (int64_t x = 0; x < HD; ++x) dst_k[at + x] += row[HC + x], dst_v[at + x] += row[HC + HD + x];
    }
  });
  if (!pad_k) dpad_k = dpad_k.view({0}), dpad_v = dpad_v.view({0});
  dpad_k = dpad_k.to(q.scalar_type()), dpad_v = dpad_v.to(q.scalar_type());
  return {dq, dk, dv, dr, dpad_k, dpad_v};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "sliding-dilated attention forward: (out, probs)");
  m.def("backward", &backward, "sliding-dilated attention backward: (dq, dk, dv, dr, dpad_k, dpad_v)");
}
