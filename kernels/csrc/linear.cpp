// Bandwidth-bound GEMV / skinny GEMM for decode on the CPU.
//
// Decode multiplies a few activation rows by every weight matrix once per step, so
// its speed is the speed at which the weights stream from DRAM.  A BLAS GEMV often runs
// on one core (MKL's fp32 GEMV on the AMD dev machine: 12-18 GB/s of 32) or converts
// bf16 through a generic path (oneDNN: 14-16 GB/s of 25 on the Intel one).  This kernel
// gives every thread a contiguous slice of weight rows and walks them in blocks of
// ROWS rows x up to COLS activation rows, so each weight vector loaded from memory feeds
// COLS fused multiply-adds from registers: at M = 1 it streams, at M = 16 it reuses
// each weight cache line 16 times.  bf16 uses AVX-512 BF16 dot products (vdpbf16ps,
// two bf16 pairs per fp32 lane) where the CPU has them, else widens to fp32.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu_kernels.h"

namespace infbench_cpu {
namespace {

constexpr int ROWS = 4;  // weight rows per block
constexpr int COLS = 4;  // activation rows per block (ROWS * COLS accumulators)
// Software prefetch distance in bytes ahead of each weight row's read position.  A
// thread's rows are one contiguous slice, so this pulls in the lines of the next two
// blocks while the current one is summed.  Measured on the 2-core Emerald Rapids dev
// machine (SmolLM2's 121 decode GEMVs, bf16, M = 1): none 19-21 GB/s, 2 KiB 22,
// 4 KiB 25, 8 KiB 26-28 (a 1 GiB x.sum() reads 22-24): the hardware prefetchers alone
// do not keep enough lines in flight for rows only 18-36 cache lines long.
constexpr int64_t PREFETCH_BYTES = 8192;

template <typename T>
inline void prefetch_ahead(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + PREFETCH_BYTES, _MM_HINT_T0);
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
inline float load_scalar(const T* p, int64_t i);
template <>
inline float load_scalar<float>(const float* p, int64_t i) { return p[i]; }
template <>
inline float load_scalar<uint16_t>(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }

// Dot products of R weight rows with C activation rows over k in [k0, K), scalar.
template <typename T, int R, int C>
inline void dot_tail(const T* w, const T* x, int64_t K, int64_t ldx, int64_t k0,
                     float (&out)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = 0.f;
      for (int64_t k = k0; k < K; ++k) s += load_scalar(w + r * K, k) * load_scalar(x + c * ldx, k);
      out[r][c] += s;
    }
}

#if defined(__AVX512F__)
// ---- AVX-512: 16 fp32 lanes -------------------------------------------------------
template <int R, int C>
inline void block_f32(const float* w, const float* x, int64_t K, int64_t ldx,
                      float (&out)[R][C]) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = _mm512_loadu_ps(x + c * ldx + k);
    for (int r = 0; r < R; ++r) {
      prefetch_ahead(w + r * K + k);
      __m512 wv = _mm512_loadu_ps(w + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  if (k < K) dot_tail<float, R, C>(w, x, K, ldx, k, out);
}

template <int R, int C>
inline void block_bf16(const uint16_t* w, const uint16_t* x, int64_t K, int64_t ldx,
                       float (&out)[R][C]) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
#if defined(__AVX512BF16__)
  for (; k + 32 <= K; k += 32) {
    __m512bh xv[C];
    for (int c = 0; c < C; ++c) xv[c] = (__m512bh)_mm512_loadu_si512(x + c * ldx + k);
    for (int r = 0; r < R; ++r) {
      prefetch_ahead(w + r * K + k);
      __m512bh wv = (__m512bh)_mm512_loadu_si512(w + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
    }
  }
#else
  for (; k + 16 <= K; k += 16) {
    __m512 xv[C];
    for (int c = 0; c < C; ++c)
      xv[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + c * ldx + k))), 16));
    for (int r = 0; r < R; ++r) {
      prefetch_ahead(w + r * K + k);  // twice per cache line here: cheap next to the stall
      __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + r * K + k))), 16));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
  if (k < K) dot_tail<uint16_t, R, C>(w, x, K, ldx, k, out);
}

#elif defined(__AVX2__) && defined(__FMA__)
// ---- AVX2 + FMA: 8 fp32 lanes -----------------------------------------------------
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

template <typename T, int R, int C>
inline void block_avx2(const T* w, const T* x, int64_t K, int64_t ldx, float (&out)[R][C]) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = load8(x + c * ldx + k);
    for (int r = 0; r < R; ++r) {
      prefetch_ahead(w + r * K + k);  // two to four times per cache line (8 lanes)
      __m256 wv = load8(w + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = hsum256(acc[r][c]);
  if (k < K) dot_tail<T, R, C>(w, x, K, ldx, k, out);
}
template <int R, int C>
inline void block_f32(const float* w, const float* x, int64_t K, int64_t ldx, float (&out)[R][C]) {
  block_avx2<float, R, C>(w, x, K, ldx, out);
}
template <int R, int C>
inline void block_bf16(const uint16_t* w, const uint16_t* x, int64_t K, int64_t ldx,
                       float (&out)[R][C]) {
  block_avx2<uint16_t, R, C>(w, x, K, ldx, out);
}

#else
// ---- portable fallback -----------------------------------------------------------
template <int R, int C>
inline void block_f32(const float* w, const float* x, int64_t K, int64_t ldx, float (&out)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = 0.f;
  dot_tail<float, R, C>(w, x, K, ldx, 0, out);
}
template <int R, int C>
inline void block_bf16(const uint16_t* w, const uint16_t* x, int64_t K, int64_t ldx,
                       float (&out)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c] = 0.f;
  dot_tail<uint16_t, R, C>(w, x, K, ldx, 0, out);
}
#endif

template <typename T, int R, int C>
inline void block(const T* w, const T* x, int64_t K, int64_t ldx, float (&out)[R][C]) {
  if constexpr (sizeof(T) == 4)
    block_f32<R, C>(w, x, K, ldx, out);
  else
    block_bf16<R, C>(w, x, K, ldx, out);
}

template <int R, int C, typename T>
inline void store(const float (&acc)[R][C], const float* bias, void* y, int64_t N, int64_t n,
                  int64_t m, bool y_bf16) {
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      float v = acc[r][c] + (bias ? bias[n + r] : 0.f);
      int64_t i = (m + c) * N + n + r;
      if (y_bf16)
        static_cast<uint16_t*>(y)[i] = float_to_bf16(v);
      else
        static_cast<float*>(y)[i] = v;
    }
}

// Rows [n0, n1) of y for every activation row: ROWS x COLS blocks, then the edges.
template <typename T>
void linear_rows(const T* x, const T* w, const float* bias, void* y, int64_t M, int64_t N,
                 int64_t K, int64_t ldx, bool y_bf16, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + ROWS <= n1; n += ROWS) {
    const T* wn = w + n * K;
    int64_t m = 0;
    for (; m + COLS <= M; m += COLS) {
      float acc[ROWS][COLS];
      block<T, ROWS, COLS>(wn, x + m * ldx, K, ldx, acc);
      store<ROWS, COLS, T>(acc, bias, y, N, n, m, y_bf16);
    }
    for (; m < M; ++m) {
      float acc[ROWS][1];
      block<T, ROWS, 1>(wn, x + m * ldx, K, ldx, acc);
      store<ROWS, 1, T>(acc, bias, y, N, n, m, y_bf16);
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float acc[1][1];
      block<T, 1, 1>(w + n * K, x + m * ldx, K, ldx, acc);
      store<1, 1, T>(acc, bias, y, N, n, m, y_bf16);
    }
}

}  // namespace

void linear(const void* x, const void* w, const float* bias, void* y, int64_t M, int64_t N,
            int64_t K, int64_t ldx, bool bf16, bool y_bf16) {
  // Split the N weight rows evenly over the threads, in whole blocks: one contiguous
  // slice each, so every core streams its own part of the matrix.
  int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  int64_t blocks = (N + ROWS - 1) / ROWS;
  int64_t grain = std::max<int64_t>(1, (blocks + threads - 1) / threads);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    int64_t n0 = b0 * ROWS, n1 = std::min(N, b1 * ROWS);
    if (bf16)
      linear_rows(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w), bias, y, M,
                  N, K, ldx, y_bf16, n0, n1);
    else
      linear_rows(static_cast<const float*>(x), static_cast<const float*>(w), bias, y, M, N, K,
                  ldx, y_bf16, n0, n1);
  });
}

}  // namespace infbench_cpu
