// 16 fp32 lanes for the head sweep (sliding_dilated_cpu_sweep.h): one __m512 on AVX-512 builds, two __m256 on
// AVX2 + FMA + F16C builds. The sweep is written once against these operations:
//
//   F                        16 fp32 lanes;  M: a lane mask (first(m): lanes j < m)
//   load/loadu/store/storeu  16 floats (load/store: 64-byte aligned);  set1, zero
//   add sub mul div max      lane-wise;  fmadd(a, b, c) = a·b + c,  fnmadd(a, b, c) = c - a·b
//   round_nearest(x), scale2(y, n) = y·2^n (n integral, -126 <= n <= 0 here)
//   maskz(m, x)              x where m, else +0 (bit-exact: a NaN outside m is gone)
//   reduce_max(m, x), reduce_add(m, x)         over the lanes of m
//   load_first<C>(p), store_first<C>(p, x)     lanes j < C from / to p (a compile-time count, no masked moves)
//   hsum<C>(a)               lane j = the sum of the 16 lanes of a[j], j < C (C in {2, 4, 8, 16})
//   widen16<K>(p), narrow16<K>(p, x)           16 elements of kind K <-> F (narrow: round to nearest even,
//                                              non-temporal stores when p is aligned: outputs are written once)
//
// SD_LANES is 512 or 256 when this build has one of the two, else undefined (the sweep is then absent).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define SD_LANES 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SD_LANES 256
#endif

#ifdef SD_LANES
#include <immintrin.h>

#include <cstdint>

namespace sdlanes {

enum class Kind { f32, bf16, f16 };

template <Kind K>
constexpr int64_t element_bytes = K == Kind::f32 ? 4 : 2;

template <Kind K>
inline bool aligned_for_stream(const void* p) { return reinterpret_cast<uintptr_t>(p) % (16 * element_bytes<K>) == 0; }

#if SD_LANES == 512
using F = __m512;
using M = __mmask16;

inline F zero() { return _mm512_setzero_ps(); }
inline F set1(float x) { return _mm512_set1_ps(x); }
inline F load(const float* p) { return _mm512_load_ps(p); }
inline F loadu(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, F x) { _mm512_store_ps(p, x); }
inline void storeu(float* p, F x) { _mm512_storeu_ps(p, x); }
inline F add(F a, F b) { return _mm512_add_ps(a, b); }
inline F sub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F div(F a, F b) { return _mm512_div_ps(a, b); }
inline F max(F a, F b) { return _mm512_max_ps(a, b); }
inline F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
inline F round_nearest(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT); }
inline F scale2(F y, F n) { return _mm512_scalef_ps(y, n); }
inline M first(int m) { return M((1u << m) - 1); }
inline F maskz(M m, F x) { return _mm512_maskz_mov_ps(m, x); }
inline float reduce_max(M m, F x) { return _mm512_mask_reduce_max_ps(m, x); }
inline float reduce_add(M m, F x) { return _mm512_mask_reduce_add_ps(m, x); }
template <int C>
inline F load_first(const float* p) { return _mm512_maskz_loadu_ps(first(C), p); }
template <int C>
inline void store_first(float* p, F x) { _mm512_mask_storeu_ps(p, first(C), x); }

template <Kind K>
inline F widen16(const void* x) {
  if constexpr (K == Kind::f32) return _mm512_loadu_ps(static_cast<const float*>(x));
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(x));
  if constexpr (K == Kind::f16) return _mm512_cvtph_ps(raw);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));  // bf16: the high half of fp32
}

template <Kind K>
inline void narrow16(void* dst, F x) {
  const bool aligned = aligned_for_stream<K>(dst);
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

// hsum: four pairing levels halve the partials per vector (16 -> 8 -> 4 -> 2 -> 1) and the vectors (a lone vector
// pairs with itself); each level adds two shuffles of a pair, so a total never mixes two vectors. The levels leave
// the totals in a fixed lane order, found once (order<C>) and undone by one permute.
template <int N>
[[gnu::always_inline]] inline void pair_level(F* a, int level) {
  const int pairs = N > 1 ? N / 2 : 1;
  for (int i = 0; i < pairs; ++i) {
    const F x = a[2 * i], y = N > 1 ? a[2 * i + 1] : a[0];
    F lo, hi;
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
[[gnu::always_inline]] inline F hsum_unordered(F (&a)[C]) {
  pair_level<C>(a, 0);
  pair_level<(C > 1 ? C / 2 : 1)>(a, 1);
  pair_level<(C > 2 ? C / 4 : 1)>(a, 2);
  pair_level<(C > 4 ? C / 8 : 1)>(a, 3);
  return a[0];
}

template <int C>
const __m512i& order() {  // lane j of the permute: where hsum_unordered left vector j's total
  static const __m512i idx = [] {
    F a[C];
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
[[gnu::always_inline]] inline F hsum(F (&a)[C]) {
  return _mm512_permutexvar_ps(order<C>(), hsum_unordered<C>(a));
}

#else  // SD_LANES == 256: lanes 0-7 in lo, 8-15 in hi
struct F {
  __m256 lo, hi;
};
using M = F;  // all-ones lanes where set

inline F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F load(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
inline F loadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, F x) { _mm256_store_ps(p, x.lo), _mm256_store_ps(p + 8, x.hi); }
inline void storeu(float* p, F x) { _mm256_storeu_ps(p, x.lo), _mm256_storeu_ps(p + 8, x.hi); }
inline F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F sub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F div(F a, F b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F fmadd(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F fnmadd(F a, F b, F c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline F round_nearest(F x) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, mode), _mm256_round_ps(x.hi, mode)};
}
inline __m256 pow2(__m256 n) {  // 2^n for integral -126 <= n <= 127: the exponent field n + 127
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline F scale2(F y, F n) { return {_mm256_mul_ps(y.lo, pow2(n.lo)), _mm256_mul_ps(y.hi, pow2(n.hi))}; }
inline M first(int m) {  // lanes j < m all ones: 16 words of a table of 16 ones then 16 zeros, from 16 - m
  alignas(64) static const int32_t table[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  const float* at = reinterpret_cast<const float*>(table + 16 - m);
  return loadu(at);
}
inline F maskz(M m, F x) { return {_mm256_and_ps(m.lo, x.lo), _mm256_and_ps(m.hi, x.hi)}; }
inline float reduce8_max(__m256 x) {
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  return _mm_cvtss_f32(_mm_max_ss(y, _mm_movehdup_ps(y)));
}
inline float reduce8_add(__m256 x) {  // ((0+4) + (2+6)) + ((1+5) + (3+7))
  __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_add_ps(y, _mm_movehl_ps(y, y));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}
inline float reduce_max(M m, F x) {
  const __m256 low = _mm256_set1_ps(-__builtin_inff());
  return reduce8_max(_mm256_max_ps(_mm256_blendv_ps(low, x.lo, m.lo), _mm256_blendv_ps(low, x.hi, m.hi)));
}
inline float reduce_add(M m, F x) {
  return reduce8_add(_mm256_add_ps(_mm256_and_ps(m.lo, x.lo), _mm256_and_ps(m.hi, x.hi)));
}
template <int C>
inline F load_first(const float* p) {
  if constexpr (C == 16) return loadu(p);
  if constexpr (C == 8) return {_mm256_loadu_ps(p), _mm256_setzero_ps()};
  if constexpr (C == 4) return {_mm256_zextps128_ps256(_mm_loadu_ps(p)), _mm256_setzero_ps()};
  if constexpr (C == 2)
    return {_mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)))), _mm256_setzero_ps()};
}
template <int C>
inline void store_first(float* p, F x) {
  if constexpr (C == 16) storeu(p, x);
  if constexpr (C == 8) _mm256_storeu_ps(p, x.lo);
  if constexpr (C == 4) _mm_storeu_ps(p, _mm256_castps256_ps128(x.lo));
  if constexpr (C == 2) _mm_store_sd(reinterpret_cast<double*>(p), _mm_castps_pd(_mm256_castps256_ps128(x.lo)));
}

template <Kind K>
inline F widen16(const void* x) {
  if constexpr (K == Kind::f32) return loadu(static_cast<const float*>(x));
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(x));
  const __m128i lo = _mm256_castsi256_si128(raw), hi = _mm256_extracti128_si256(raw, 1);
  if constexpr (K == Kind::f16) return {_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi)};
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16)),  // bf16: the high half of fp32
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16))};
}

inline __m256i bf16_bits(__m256 x) {  // round to nearest even (c10::BFloat16's rounding), NaN kept quiet; low 16 bits
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_srli_epi32(_mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                                                _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan)), 16);
}

template <Kind K>
inline void narrow16(void* dst, F x) {
  const bool aligned = aligned_for_stream<K>(dst);
  if constexpr (K == Kind::f32) {
    float* d = static_cast<float*>(dst);
    if (aligned) return _mm256_stream_ps(d, x.lo), _mm256_stream_ps(d + 8, x.hi);
    return storeu(d, x);
  }
  __m256i half;
  if constexpr (K == Kind::f16) {
    constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    half = _mm256_set_m128i(_mm256_cvtps_ph(x.hi, mode), _mm256_cvtps_ph(x.lo, mode));
  } else {  // packus works per 128-bit lane: [lo 0-3, hi 0-3, lo 4-7, hi 4-7], put back in order
    half = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(x.lo), bf16_bits(x.hi)), 0xD8);
  }
  __m256i* d = static_cast<__m256i*>(dst);
  return aligned ? _mm256_stream_si256(d, half) : _mm256_storeu_si256(d, half);
}

// hsum: the two halves of each vector added, then the hadd tree of 8-lane vectors (vectors 8g .. 8g + 7 into the
// lanes of half g): two hadd levels leave per 128-bit half [t0 t1 t2 t3] of four vectors' partials (low half: lanes
// 0-3 of each, high half: 4-7); one cross-half add of two such results finishes eight totals in order.
template <int N>
[[gnu::always_inline]] inline __m256 hsum8(const __m256* s) {  // lane j: the total of s[j], j < N (N in {2, 4, 8})
  if constexpr (N == 8) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  } else {
    const __m256 t = N == 4 ? _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]))
                            : _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[0], s[1]));
    return _mm256_add_ps(t, _mm256_permute2f128_ps(t, t, 0x01));
  }
}

template <int C>
[[gnu::always_inline]] inline F hsum(F (&a)[C]) {
  __m256 s[C];
  for (int j = 0; j < C; ++j) s[j] = _mm256_add_ps(a[j].lo, a[j].hi);
  if constexpr (C == 16) return {hsum8<8>(s), hsum8<8>(s + 8)};
  else return {hsum8<C>(s), _mm256_setzero_ps()};
}
#endif

}  // namespace sdlanes
#endif
