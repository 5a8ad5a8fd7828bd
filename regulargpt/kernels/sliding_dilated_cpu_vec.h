// Vectorised row helpers of sliding_dilated_cpu.cpp: one head's row of Dh elements, at::vec::Vectorized of the
// accumulation type A (fp32 for fp32/bf16/fp16 inputs, fp64 for fp64), L = Vectorized<A>::size() lanes.
//
//   load(x, n)              the n <= L elements at x in A (bf16/fp16 widened by at::vec's converters), zeros after
//   dot(a, x, Dh)           sum_d a[d] x[d]: two lane-wise accumulators, then one fixed reduction tree
//   dots(a, x, m, Dh, s)    s[j] = dot(a, x[j], Dh) for j < m, the same bits, up to four keys per pass over a
//   combine(dst, w, x, m)   dst[d] = sum_{j<m} w[j] x[j][d], in j order, 4 vectors of accumulators in registers
//
// Every sum runs in an order fixed by Dh alone (not by alignment or threads), so reruns are bit-identical. Full
// aligned vectors are stored non-temporally (outputs are written once: no read-for-ownership of their lines).
#pragma once

// at::vec compiles its AVX2 specialisations only under CPU_CAPABILITY_AVX2 (ATen sets it per kernel file); this
// file is built with -march=native, so turn them on when the compiler targets AVX2 and FMA (else: the portable
// at::vec, still correct). Before any ATen header, so that every inclusion of at::vec sees the same setting.
#if defined(__AVX2__) && defined(__FMA__) && !defined(CPU_CAPABILITY)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <type_traits>

namespace sdvec {

template <typename T>
using Acc = at::opmath_type<T>;
template <typename T>
using Vec = at::vec::Vectorized<Acc<T>>;

template <typename T>
inline Vec<T> load(const T* x, int64_t n) {
  using V = Vec<T>;
  if constexpr (std::is_same_v<T, Acc<T>>) {
    return n == V::size() ? V::loadu(x) : V::loadu(x, n);
  } else {
    V out;
    if (n == V::size()) {
      if constexpr (std::is_same_v<T, c10::BFloat16>) at::vec::load_fp32_from_bf16(x, out);
      else at::vec::load_fp32_from_fp16(x, out);
    } else {
      Acc<T> wide[V::size()] = {};
      for (int64_t d = 0; d < n; ++d) wide[d] = static_cast<Acc<T>>(x[d]);
      out = V::loadu(wide);
    }
    return out;
  }
}

template <typename T>
inline void store(T* dst, const Vec<T>& v, int64_t n) {
  using V = Vec<T>;
#if defined(CPU_CAPABILITY_AVX2)
  if (n == V::size() && reinterpret_cast<uintptr_t>(dst) % (V::size() * sizeof(T)) == 0) {
    if constexpr (std::is_same_v<T, float>) return _mm256_stream_ps(dst, v);
    if constexpr (std::is_same_v<T, double>) return _mm256_stream_pd(dst, v);
    if constexpr (std::is_same_v<T, c10::BFloat16>)
      return _mm_stream_si128(reinterpret_cast<__m128i*>(dst), at::vec::cvtfp32_bf16(__m256(v)));
    if constexpr (std::is_same_v<T, c10::Half>)
      return _mm_stream_si128(reinterpret_cast<__m128i*>(dst), at::vec::cvtfp32_fp16(__m256(v)));
  }
#endif
  if constexpr (std::is_same_v<T, Acc<T>>) {
    v.store(dst, n);
  } else {
    Acc<T> wide[V::size()];
    v.store(wide);
    for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<T>(wide[d]);
  }
}

inline void store_fence() {  // a work unit's non-temporal stores, visible before it returns
#if defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

template <typename T>  // a in the accumulation type (converted once per row), x in the input type
inline Acc<T> dot(const Acc<T>* a, const T* x, int64_t n) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  V even(0), odd(0);
  int64_t d = 0;
  for (; d + 2 * L <= n; d += 2 * L) {
    even = at::vec::fmadd(V::loadu(a + d), load(x + d, L), even);
    odd = at::vec::fmadd(V::loadu(a + d + L), load(x + d + L, L), odd);
  }
  if (d + L <= n) even = at::vec::fmadd(V::loadu(a + d), load(x + d, L), even), d += L;
  if (d < n) odd = at::vec::fmadd(V::loadu(a + d, n - d), load(x + d, n - d), odd);
  return at::vec::vec_reduce_all([](const V& u, const V& w) { return u + w; }, even + odd);
}

// s[k] = a . x[k] for k < K: each load of a feeds K keys' FMAs (2K independent accumulator chains hide the FMA
// latency); per key dot()'s two accumulators, tail and reduction tree, so the same bits as K calls of dot().
template <int K, typename A>
[[gnu::always_inline]] inline void dots_of(const A* a, const A* const* x, int64_t n, A* s) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  V even[K], odd[K];
  for (int k = 0; k < K; ++k) even[k] = V(0), odd[k] = V(0);
  int64_t d = 0;
  for (; d + 2 * L <= n; d += 2 * L) {
    const V ae = V::loadu(a + d), ao = V::loadu(a + d + L);
    for (int k = 0; k < K; ++k)
      even[k] = at::vec::fmadd(ae, V::loadu(x[k] + d), even[k]),
      odd[k] = at::vec::fmadd(ao, V::loadu(x[k] + d + L), odd[k]);
  }
  if (d + L <= n) {
    for (int k = 0; k < K; ++k) even[k] = at::vec::fmadd(V::loadu(a + d), V::loadu(x[k] + d), even[k]);
    d += L;
  }
  if (d < n)
    for (int k = 0; k < K; ++k) odd[k] = at::vec::fmadd(V::loadu(a + d, n - d), V::loadu(x[k] + d, n - d), odd[k]);
  const auto sum = [](const V& u, const V& w) { return u + w; };
  for (int k = 0; k < K; ++k) s[k] = at::vec::vec_reduce_all(sum, even[k] + odd[k]);
}

// s[j] = a . x[j] for j < m (the C scores of a query, or dP): keys four, then two, then one at a time.
template <typename A>
[[gnu::always_inline]] inline void dots(const A* a, const A* const* x, int64_t m, int64_t n, A* s) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) dots_of<4>(a, x + j, n, s + j);
  if (j + 2 <= m) dots_of<2>(a, x + j, n, s + j), j += 2;
  if (j < m) dots_of<1>(a, x + j, n, s + j);
}

template <typename T, typename X>  // X: the rows' type (the input type, or A for rows converted once)
inline void combine(T* dst, const Acc<T>* w, const X* const* x, int64_t m, int64_t n) {
  using V = Vec<T>;
  constexpr int64_t L = V::size();
  int64_t d = 0;
  for (; d + 4 * L <= n; d += 4 * L) {  // four independent accumulators: the FMAs' latency overlaps
    V a0(0), a1(0), a2(0), a3(0);
    for (int64_t j = 0; j < m; ++j) {
      const V wj(w[j]);
      const X* xj = x[j] + d;
      a0 = at::vec::fmadd(wj, load(xj, L), a0), a1 = at::vec::fmadd(wj, load(xj + L, L), a1);
      a2 = at::vec::fmadd(wj, load(xj + 2 * L, L), a2), a3 = at::vec::fmadd(wj, load(xj + 3 * L, L), a3);
    }
    store(dst + d, a0, L), store(dst + d + L, a1, L), store(dst + d + 2 * L, a2, L), store(dst + d + 3 * L, a3, L);
  }
  for (; d < n; d += L) {
    const int64_t width = std::min<int64_t>(L, n - d);
    V acc(0);
    for (int64_t j = 0; j < m; ++j) acc = at::vec::fmadd(V(w[j]), load(x[j] + d, width), acc);
    store(dst + d, acc, width);
  }
}

template <typename T>  // y[d] += alpha x[d] (the pads' gradients: a few rows per work unit)
inline void axpy(Acc<T>* y, Acc<T> alpha, const T* x, int64_t n) {
  using V = Vec<T>;
  for (int64_t d = 0; d < n; d += V::size()) {
    const int64_t width = std::min<int64_t>(V::size(), n - d);
    at::vec::fmadd(V(alpha), load(x + d, width), V::loadu(y + d, width)).store(y + d, width);
  }
}

template <typename T>  // x[0..n) = exp(x), lane-wise (Sleef under AVX2)
inline void exp_inplace(Acc<T>* x, int64_t n) {
  using V = Vec<T>;
  for (int64_t d = 0; d < n; d += V::size()) {
    const int64_t width = std::min<int64_t>(V::size(), n - d);
    V::loadu(x + d, width).exp().store(x + d, width);
  }
}

}  // namespace sdvec
