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
#include <vector>

#include "cpu_kernels.h"
#include "quant_kernels.h"

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

// ---- weight-only int8 / int4 (quant_kernels.h) ---------------------------------------
// The weights are dequantized a chunk at a time (QROWS rows x up to QCHUNK columns) into a
// per-thread fp32 buffer that stays in L1, and the fp32 dot blocks above multiply it with
// the activation rows.  Only the packed bytes come from memory (1 or 0.5 byte per weight
// plus the fp16 scales), so decode reads 2-8x fewer bytes than bf16/fp32 weights.
namespace {

constexpr int64_t QCHUNK = 1024;  // columns per chunk (a multiple of every group size)

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// Row n, columns [k0, k0 + kc) of dequant(w) -> out[0:kc] (k0 and kc multiples of 32 for
// int4 and of the group for both).
inline void dequant_row(const QuantWeight& w, int64_t n, int64_t k0, int64_t kc, float* out) {
  const int64_t groups = w.K / w.group;
  const uint16_t* sc = w.scales + n * groups;
  if (w.bits == 8) {
    const int8_t* q = static_cast<const int8_t*>(w.q) + n * w.K;
    for (int64_t g0 = k0; g0 < k0 + kc; g0 += w.group) {
      const float s = half_to_float(sc[g0 / w.group]);
      const int64_t end = std::min(k0 + kc, g0 + w.group);
      int64_t k = g0;
#if defined(__AVX512F__)
      const __m512 sv = _mm512_set1_ps(s);
      for (; k + 16 <= end; k += 16) {
        if ((k & 63) == 0) prefetch_ahead(q + k);
        __m512 v = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k))));
        _mm512_storeu_ps(out + (k - k0), _mm512_mul_ps(v, sv));
      }
#endif
      for (; k < end; ++k) out[k - k0] = static_cast<float>(q[k]) * s;
    }
    return;
  }
  const uint8_t* p = static_cast<const uint8_t*>(w.q) + n * (w.K / 2);
  const uint16_t* mn = w.mins + n * groups;
  for (int64_t b = k0; b < k0 + kc; b += 32) {  // one 32-column block: 16 bytes
    const int64_t g = b / w.group;
    const float s = half_to_float(sc[g]), m = half_to_float(mn[g]);
    const uint8_t* bytes = p + b / 2;
    float* o = out + (b - k0);
#if defined(__AVX512F__)
    if ((b & 127) == 0) prefetch_ahead(bytes);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m512 sv = _mm512_set1_ps(s), mv = _mm512_set1_ps(m);
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, low4)));
    __m512 hi = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), low4)));
    _mm512_storeu_ps(o, _mm512_fmadd_ps(lo, sv, mv));
    _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(hi, sv, mv));
#else
    for (int j = 0; j < 16; ++j) {
      o[j] = static_cast<float>(bytes[j] & 15) * s + m;
      o[j + 16] = static_cast<float>(bytes[j] >> 4) * s + m;
    }
#endif
  }
}

template <int R>
void quant_rows_block(const float* x, const QuantWeight& w, const float* bias, void* y,
                      int64_t M, bool y_bf16, int64_t n, float* buf) {
  const int64_t K = w.K;
  const int64_t chunk = K <= QCHUNK ? K : QCHUNK;
  // acc[r][m] summed over the chunks; dot blocks of R rows x COLS activation rows.
  float total[R][32];
  for (int r = 0; r < R; ++r)
    for (int64_t m = 0; m < M; ++m) total[r][m] = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t kc = std::min(chunk, K - k0);
    for (int r = 0; r < R; ++r) dequant_row(w, n + r, k0, kc, buf + r * kc);
    int64_t m = 0;
    for (; m + COLS <= M; m += COLS) {
      float acc[R][COLS];
      block<float, R, COLS>(buf, x + m * K + k0, kc, K, acc);
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < COLS; ++c) total[r][m + c] += acc[r][c];
    }
    for (; m < M; ++m) {
      float acc[R][1];
      block<float, R, 1>(buf, x + m * K + k0, kc, K, acc);
      for (int r = 0; r < R; ++r) total[r][m] += acc[r][0];
    }
  }
  for (int64_t m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      float v = total[r][m] + (bias ? bias[n + r] : 0.f);
      int64_t i = m * w.N + n + r;
      if (y_bf16)
        static_cast<uint16_t*>(y)[i] = float_to_bf16(v);
      else
        static_cast<float*>(y)[i] = v;
    }
}

#if defined(__AVX512F__)
// M = 1 (batch-1 decode), R rows at a time, dequantizing in registers: the codes are
// widened and multiplied with x straight away, the group's scale is applied once per group
// to the partial sums, and the int4 minimums through the per-group sums of x (xsum), so no
// dequantized weight is ever stored.  About half the instructions of the buffered path.
template <int R>
inline void quant_gemv_rows(const float* x, const float* xsum, const QuantWeight& w, int64_t n,
                            float (&out)[R]) {
  const int64_t K = w.K, groups = K / w.group;
  __m512 acc[R];
  float min_part[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    min_part[r] = 0.f;
  }
  const uint16_t* sc = w.scales + n * groups;
  if (w.bits == 8) {
    const int8_t* q = static_cast<const int8_t*>(w.q) + n * K;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * w.group, k1 = k0 + w.group;
      __m512 part[R];
      for (int r = 0; r < R; ++r) part[r] = _mm512_setzero_ps();
      int64_t k = k0;
      for (; k + 16 <= k1; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
        for (int r = 0; r < R; ++r) {
          const int8_t* p = q + r * K + k;
          if ((k & 63) == 0) prefetch_ahead(p);
          const __m512 qv = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
          part[r] = _mm512_fmadd_ps(qv, xv, part[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        float tail = 0.f;
        for (int64_t j = k; j < k1; ++j) tail += static_cast<float>(q[r * K + j]) * x[j];
        const float s = half_to_float(sc[r * groups + g]);
        acc[r] = _mm512_fmadd_ps(part[r], _mm512_set1_ps(s), acc[r]);
        min_part[r] += tail * s;
      }
    }
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(w.q) + n * (K / 2);
    const uint16_t* mn = w.mins + n * groups;
    // The codes become floats by a table lookup: vpermps reads only the low 4 bits of each
    // index lane, so the zero-extended byte indexes its low nibble as it is and its high
    // nibble after one shift (one widen, one shift, two permutes per 32 weights, against
    // two masks, a shift, two widens and two converts; measured 1.3-1.4x on the Emerald
    // Rapids dev machine).
    const __m512 codes = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f,
                                        11.f, 12.f, 13.f, 14.f, 15.f);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * w.group, k1 = k0 + w.group;
      __m512 part[R];
      for (int r = 0; r < R; ++r) part[r] = _mm512_setzero_ps();
      for (int64_t b = k0; b < k1; b += 32) {
        const __m512 xlo = _mm512_loadu_ps(x + b), xhi = _mm512_loadu_ps(x + b + 16);
        for (int r = 0; r < R; ++r) {
          const uint8_t* p = q + r * (K / 2) + b / 2;
          if ((b & 127) == 0) prefetch_ahead(p);
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
          const __m512 lo = _mm512_permutexvar_ps(v, codes);
          const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), codes);
          part[r] = _mm512_fmadd_ps(hi, xhi, _mm512_fmadd_ps(lo, xlo, part[r]));
        }
      }
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(part[r], _mm512_set1_ps(half_to_float(sc[r * groups + g])),
                                 acc[r]);
        min_part[r] += half_to_float(mn[r * groups + g]) * xsum[g];
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]) + min_part[r];
}
#endif

}  // namespace

void quant_linear(const float* x, const QuantWeight& w, const float* bias, void* y, int64_t M,
                  bool y_bf16) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  std::vector<float> xq;
  if (w.act_int8) {
    if (quant_gemv_q8act(x, M, w, bias, y, y_bf16)) return;
    // the same rounded activations through the float path below
    xq.resize(static_cast<size_t>(M * w.K));
    quantize_activation_rows(x, xq.data(), M, w.K);
    x = xq.data();
  }
#if defined(__AVX512F__)
  if (M == 1) {
    const int64_t groups = w.K / w.group;
    std::vector<float> xsum(static_cast<size_t>(groups), 0.f);  // int4 minimums: sum of x
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k) xsum[g] += x[k];
    const int64_t blocks = (w.N + ROWS - 1) / ROWS;
    const int64_t grain = std::max<int64_t>(1, (blocks + threads - 1) / threads);
    auto put = [&](int64_t n, float v) {
      v += bias ? bias[n] : 0.f;
      if (y_bf16)
        static_cast<uint16_t*>(y)[n] = float_to_bf16(v);
      else
        static_cast<float*>(y)[n] = v;
    };
    at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      const int64_t n1 = std::min(w.N, b1 * ROWS);
      int64_t n = b0 * ROWS;
      for (; n + ROWS <= n1; n += ROWS) {
        float out[ROWS];
        quant_gemv_rows<ROWS>(x, xsum.data(), w, n, out);
        for (int r = 0; r < ROWS; ++r) put(n + r, out[r]);
      }
      for (; n < n1; ++n) {
        float out[1];
        quant_gemv_rows<1>(x, xsum.data(), w, n, out);
        put(n, out[0]);
      }
    });
    return;
  }
#endif
  const int64_t blocks = (w.N + ROWS - 1) / ROWS;
  const int64_t grain = std::max<int64_t>(1, (blocks + threads - 1) / threads);
  const int64_t chunk = w.K <= QCHUNK ? w.K : QCHUNK;
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> buf;
    if (static_cast<int64_t>(buf.size()) < ROWS * chunk) buf.resize(ROWS * chunk);
    const int64_t n1 = std::min(w.N, b1 * ROWS);
    int64_t n = b0 * ROWS;
    for (; n + ROWS <= n1; n += ROWS)
      quant_rows_block<ROWS>(x, w, bias, y, M, y_bf16, n, buf.data());
    for (; n < n1; ++n) quant_rows_block<1>(x, w, bias, y, M, y_bf16, n, buf.data());
  });
}

void quant_dequantize(const QuantWeight& w, void* out, bool out_bf16) {
  at::parallel_for(0, w.N, 16, [&](int64_t n0, int64_t n1) {
    thread_local std::vector<float> row;
    if (static_cast<int64_t>(row.size()) < w.K) row.resize(w.K);
    for (int64_t n = n0; n < n1; ++n) {
      if (out_bf16) {
        dequant_row(w, n, 0, w.K, row.data());
        uint16_t* o = static_cast<uint16_t*>(out) + n * w.K;
        for (int64_t k = 0; k < w.K; ++k) o[k] = float_to_bf16(row[k]);
      } else {
        dequant_row(w, n, 0, w.K, static_cast<float*>(out) + n * w.K);
      }
    }
  });
}

}  // namespace infbench_cpu
