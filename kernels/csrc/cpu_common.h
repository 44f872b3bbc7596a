// Helpers shared by the CPU kernels (not linear.cpp, which keeps its own): element types,
// fp32 vectors of the widest width this build's -march allows, a vectorized exp, row
// helpers over those vectors, and the work-sharing loop.
//
// Vector width: AVX-512 (16 lanes) when the CPU has AVX-512 F/BW/VL, else AVX2 + FMA +
// F16C (8 lanes), else scalar code (1 lane) that the compiler may still vectorize.
// Kernels are written once against `vec::V` and compile to whichever the CPU has.
#pragma once
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define INFBENCH_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INFBENCH_AVX2 1
#include <immintrin.h>
#endif

namespace infbench_cpu {

// ---- element types ---------------------------------------------------------------
// bf16 and fp16 travel as 16-bit patterns; distinct types so templates tell them apart.
struct bf16 { uint16_t bits; };
struct fp16 { uint16_t bits; };

inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return bits_to_float(static_cast<uint32_t>(v.bits) << 16); }

inline float half_bits_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    const float f = static_cast<float>(man) * 5.9604644775390625e-08f;  // subnormal: man * 2^-24
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
#endif
}
inline float to_float(fp16 v) { return half_bits_to_float(v.bits); }

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline bf16 from_float<bf16>(float f) {  // round to nearest even, as c10::BFloat16 does
  const uint32_t b = float_to_bits(f);
  if (std::isnan(f)) return bf16{0x7fc0};
  return bf16{static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16)};
}
template <>
inline fp16 from_float<fp16>(float f) {
#if defined(__F16C__)
  return fp16{static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#else
  // Round to nearest even through float arithmetic (exact for the normal range).
  const uint32_t b = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return fp16{static_cast<uint16_t>(sign | 0x7e00u)};
  if (a >= 65520.f) return fp16{static_cast<uint16_t>(sign | 0x7c00u)};
  if (a < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24
    return fp16{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.f)))};
  }
  uint32_t ab = float_to_bits(a);
  ab += 0xfffu + ((ab >> 13) & 1u);  // round the 13 dropped mantissa bits to even
  return fp16{static_cast<uint16_t>(sign | (((ab >> 23) - 112) << 10) | ((ab >> 13) & 0x3ffu))};
#endif
}

// Calls f(T{}) with T the C++ element type of `dtype`.
template <typename F>
inline void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); break;
    case DType::BFloat16: f(bf16{}); break;
    case DType::Float16: f(fp16{}); break;
  }
}

// ---- fp32 vectors ----------------------------------------------------------------
namespace vec {

#if defined(INFBENCH_AVX512)
constexpr int64_t W = 16;
using V = __m512;
inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline V zero() { return _mm512_setzero_ps(); }
inline V set1(float x) { return _mm512_set1_ps(x); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V div(V a, V b) { return _mm512_div_ps(a, b); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
inline V max(V a, V b) { return _mm512_max_ps(a, b); }
inline float sum(V a) { return _mm512_reduce_add_ps(a); }
inline float hmax(V a) { return _mm512_reduce_max_ps(a); }
// Lanes where a == -inf become 0, the others b.
inline V zero_where_neg_inf(V a, V b) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, set1(-INFINITY), _CMP_NEQ_OQ), b);
}

inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline V load(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V load(const fp16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline V load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
inline V load(const bf16* p, int64_t n) {
  __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V load(const fp16* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
inline V load(const int8_t* p) {  // int8 codes (the int8 KV cache) widened to fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline V load(const int8_t* p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail_mask(n), p)));
}

inline __m256i to_bf16_bits(V v) {  // round to nearest even; NaN -> 0x7fc0 as in c10
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}
inline __m256i to_fp16_bits(V v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void store(bf16* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(v)); }
inline void store(fp16* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_fp16_bits(v)); }
inline void store(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
inline void store(bf16* p, V v, int64_t n) { _mm256_mask_storeu_epi16(p, tail_mask(n), to_bf16_bits(v)); }
inline void store(fp16* p, V v, int64_t n) { _mm256_mask_storeu_epi16(p, tail_mask(n), to_fp16_bits(v)); }

// exp(x), Cephes' single-precision range reduction and polynomial (about 1 ulp).
inline V exp(V x) {
  const V hi = set1(88.3762626647949f), lo = set1(-88.3762626647949f);
  V xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  V fx = _mm512_roundscale_ps(fma(xc, set1(1.44269504088896341f), set1(0.5f)),
                              _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  V r = fma(fx, set1(-0.693359375f), xc);
  r = fma(fx, set1(2.12194440e-4f), r);
  V y = set1(1.9875691500e-4f);
  y = fma(y, r, set1(1.3981999507e-3f));
  y = fma(y, r, set1(8.3334519073e-3f));
  y = fma(y, r, set1(4.1665795894e-2f));
  y = fma(y, r, set1(1.6666665459e-1f));
  y = fma(y, r, set1(5.0000001201e-1f));
  y = fma(y, mul(r, r), add(r, set1(1.f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return mul(y, _mm512_castsi512_ps(e));
}

#elif defined(INFBENCH_AVX2)
constexpr int64_t W = 8;
using V = __m256;
inline V zero() { return _mm256_setzero_ps(); }
inline V set1(float x) { return _mm256_set1_ps(x); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V div(V a, V b) { return _mm256_div_ps(a, b); }
inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V max(V a, V b) { return _mm256_max_ps(a, b); }
inline float sum(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(V a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline V zero_where_neg_inf(V a, V b) {
  return _mm256_and_ps(_mm256_cmp_ps(a, set1(-INFINITY), _CMP_NEQ_OQ), b);
}
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline V load(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V load(const fp16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline V load(const int8_t* p) {  // int8 codes (the int8 KV cache) widened to fp32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
template <typename T>
inline V load(const T* p, int64_t n) {  // tails through a zeroed buffer
  T buf[8];
  std::memset(buf, 0, sizeof buf);
  std::memcpy(buf, p, n * sizeof(T));
  return load(buf);
}
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline void store(bf16* p, V v) {
  alignas(32) float f[8];
  _mm256_store_ps(f, v);
  for (int i = 0; i < 8; ++i) p[i] = from_float<bf16>(f[i]);
}
inline void store(fp16* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <typename T>
inline void store(T* p, V v, int64_t n) {
  T buf[8];
  store(buf, v);
  std::memcpy(p, buf, n * sizeof(T));
}
inline V exp(V x) {
  const V hi = set1(88.3762626647949f), lo = set1(-88.3762626647949f);
  V xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  V fx = _mm256_floor_ps(fma(xc, set1(1.44269504088896341f), set1(0.5f)));
  V r = fma(fx, set1(-0.693359375f), xc);
  r = fma(fx, set1(2.12194440e-4f), r);
  V y = set1(1.9875691500e-4f);
  y = fma(y, r, set1(1.3981999507e-3f));
  y = fma(y, r, set1(8.3334519073e-3f));
  y = fma(y, r, set1(4.1665795894e-2f));
  y = fma(y, r, set1(1.6666665459e-1f));
  y = fma(y, r, set1(5.0000001201e-1f));
  y = fma(y, mul(r, r), add(r, set1(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return mul(y, _mm256_castsi256_ps(e));
}

#else  // portable scalar fallback: one lane
constexpr int64_t W = 1;
using V = float;
inline V zero() { return 0.f; }
inline V set1(float x) { return x; }
inline V add(V a, V b) { return a + b; }
inline V sub(V a, V b) { return a - b; }
inline V mul(V a, V b) { return a * b; }
inline V div(V a, V b) { return a / b; }
inline V fma(V a, V b, V c) { return a * b + c; }
inline V max(V a, V b) { return std::max(a, b); }
inline float sum(V a) { return a; }
inline float hmax(V a) { return a; }
inline V zero_where_neg_inf(V a, V b) { return a == -INFINITY ? 0.f : b; }
template <typename T>
inline V load(const T* p) { return to_float(*p); }
template <typename T>
inline V load(const T* p, int64_t) { return to_float(*p); }
inline V load(const int8_t* p) { return static_cast<float>(*p); }  // int8 codes
inline V load(const int8_t* p, int64_t) { return static_cast<float>(*p); }
template <typename T>
inline void store(T* p, V v) { *p = from_float<T>(v); }
template <typename T>
inline void store(T* p, V v, int64_t) { *p = from_float<T>(v); }
inline V exp(V x) { return std::exp(x); }
#endif

// v rounded to T's precision and back (identity for float): what `.to(dtype).float()` gives.
template <typename T>
inline V round_to(V v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    T buf[W];
    store(buf, v);
    return load(buf);
  }
}

// ---- row helpers (n elements, any n) ---------------------------------------------

// dst[i] = float(src[i]) * scale
template <typename T>
inline void load_row(const T* src, float* dst, int64_t n, float scale) {
  const V s = set1(scale);
  int64_t i = 0;
  for (; i + W <= n; i += W) store(dst + i, mul(load(src + i), s));
  if (i < n) store(dst + i, mul(load(src + i, n - i), s), n - i);
}

// dst[i] = T(src[i] * scale)
template <typename T>
inline void store_row(const float* src, T* dst, int64_t n, float scale) {
  const V s = set1(scale);
  int64_t i = 0;
  for (; i + W <= n; i += W) store(dst + i, mul(load(src + i), s));
  if (i < n) store(dst + i, mul(load(src + i, n - i), s), n - i);
}

// y[i] *= a
inline void scale_row(float* y, int64_t n, float a) {
  const V s = set1(a);
  int64_t i = 0;
  for (; i + W <= n; i += W) store(y + i, mul(load(y + i), s));
  if (i < n) store(y + i, mul(load(y + i, n - i), s), n - i);
}

// max over x[0:n]
inline float max_row(const float* x, int64_t n) {
  V m = set1(-INFINITY);
  int64_t i = 0;
  for (; i + W <= n; i += W) m = max(m, load(x + i));
  float r = hmax(m);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// x[i] = exp(x[i] - m), 0 where x[i] == -inf; returns the sum.  m must be finite.
inline float exp_row(float* x, int64_t n, float m) {
  const V mv = set1(m);
  V acc = zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V s = load(x + i);
    V p = zero_where_neg_inf(s, exp(sub(s, mv)));
    store(x + i, p);
    acc = add(acc, p);
  }
  if (i < n) {
    V s = load(x + i, n - i);
    V p = zero_where_neg_inf(s, exp(sub(s, mv)));
    store(x + i, p, n - i);
    // Masked-off lanes loaded 0 and gave exp(-m) != 0: sum only the n - i written ones.
    float part[W];
    store(part, p);
    float total = sum(acc);
    for (int64_t j = 0; j < n - i; ++j) total += part[j];
    return total;
  }
  return sum(acc);
}

}  // namespace vec

// ---- work sharing ----------------------------------------------------------------

// Runs f(i) for i in [0, n).  Inline when the work is small (spinning up the thread pool
// costs microseconds, more than a one-token decode op takes), else on at::parallel_for's
// threads taking items from a shared counter, so uneven items (causal tiles, ragged
// contexts) and a thread the OS pauses do not leave the others idle.
template <typename F>
inline void for_each_item(int64_t n, int64_t work, int64_t min_parallel_work, const F& f) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(n, at::get_num_threads());
  if (n == 1 || work < min_parallel_work || threads <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
  });
}

// Per-thread scratch (float), grown on demand and reused across calls.
inline float* scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

}  // namespace infbench_cpu
