// int8 / int4 GEMV and skinny GEMM (up to 32 rows; int8 weights up to 4) with int8
// activations and AVX512-VNNI integer dot products (`quant.activations: int8`), the
// arithmetic llama.cpp runs its Q4_0/Q4_1/Q8_0 decode in.
//
// The float path in linear.cpp widens every code to fp32 before its FMA: for a group-32
// Q4_1 block that is a mask, a shift, two zero-extends to 32-bit lanes, two int->float
// converts and two FMAs per 32 weights per row, plus a scalar fp16 convert and broadcast
// per group for the scale and the min, so on this 2-core Emerald Rapids it runs at about
// 3 weights per cycle per core, instruction-bound well below the memory bus.  Here the
// activation row is quantized once per call to int8 in blocks of 32 (scale max|x| / 127,
// round to nearest), and one vpdpbusd multiplies 64 unsigned codes by 64 signed activation
// bytes into 16 int32 lanes.  Per 128 int4 weights (4 blocks, one 64-byte load) and row:
// mask + shift + mask, two vpdpbusd, one int->float convert, and one FMA with the blocks'
// weight scale x activation scale (fp16 scales loaded 4 at a time and spread over their
// lanes with one permute); the minimums are one FMA per 16 groups against the per-group sums
// of the quantized x.  int8 weights are made unsigned by flipping the sign bit (w + 128), and the extra
// 128 * sum(x codes) of each block is subtracted by starting the accumulator there.
//
// The activations' rounding is the only difference from the float path (about 0.4% of a
// block's largest activation per element); `infbench eval` measures what it costs.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant_kernels.h"

namespace infbench_cpu {

// Row by row, each 32-column block of x (the last one shorter when 32 does not divide K) rounded to int8 codes times the block's scale
// max|x| / 127 (codes = nearbyint(x * (127 / max|x|)), as the VNNI path quantizes): the
// values the integer path multiplies, for the float paths (more than one row, no VNNI).
void quantize_activation_rows(const float* x, float* out, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const int64_t n = std::min<int64_t>(32, K - k0);  // a last, shorter block when 32 does not divide K
      const float* xb = x + m * K + k0;
      float* ob = out + m * K + k0;
      float amax = 0.f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const float c = std::max(-127.f, std::min(127.f, std::nearbyint(xb[i] * inv)));
        ob[i] = c * d;
      }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__)

bool quant_gemv_q8act_supported() { return true; }

namespace {

constexpr int QROWS = 4;  // weight rows per register block (they share the activation loads)
constexpr int ACOLS = 4;  // activation rows per register block (they share each weight load)

// The activation row, quantized and laid out for the weight format.
struct Q8Act {
  // int4: per 4-block chunk 128 bytes: the 4 blocks' first 16 codes, then their last 16
  // (GGUF nibble order: a byte's low nibble is column j, its high nibble column j + 16).
  // int8: the codes in column order, padded to a multiple of 64.
  std::vector<int8_t> codes;
  std::vector<float> scale_lanes;  // per 64-byte load: 16 lanes, each its block's scale
  std::vector<int32_t> bias_lanes;  // int8 weights: -128 * (block code sum) in a block's first lane
  std::vector<float> group_sums;   // int4 minimums: sum of the quantized x over each weight group
};

inline int8_t round_code(float v) {
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(std::max(-127.f, std::min(127.f, r)));
}

void quantize_activation(const float* x, const QuantWeight& w, Q8Act& a) {
  const int64_t K = w.K, blocks = K / 32;
  const int64_t lane_blocks = w.bits == 4 ? 4 : 2;  // 32-column blocks per 64-byte load
  const int64_t loads = (blocks + lane_blocks - 1) / lane_blocks;
  a.codes.assign(static_cast<size_t>(loads * 64 * (w.bits == 4 ? 2 : 1)), 0);
  a.scale_lanes.assign(static_cast<size_t>(loads * 16), 0.f);
  a.bias_lanes.assign(w.bits == 8 ? static_cast<size_t>(loads * 16) : 0, 0);
  const int64_t groups = K / w.group;
  a.group_sums.assign(w.bits == 4 ? static_cast<size_t>((groups + 15) / 16 * 16) : 0, 0.f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    const int64_t load = b / lane_blocks, slot = b % lane_blocks;
    int32_t code_sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int8_t c = round_code(xb[i] * inv);
      code_sum += c;
      int64_t at;
      if (w.bits == 4)
        at = load * 128 + (i < 16 ? 0 : 64) + slot * 16 + (i & 15);
      else
        at = b * 32 + i;
      a.codes[static_cast<size_t>(at)] = c;
    }
    const int64_t lanes = 16 / lane_blocks;
    for (int64_t l = 0; l < lanes; ++l) a.scale_lanes[static_cast<size_t>(load * 16 + slot * lanes + l)] = d;
    if (w.bits == 8) a.bias_lanes[static_cast<size_t>(load * 16 + slot * lanes)] = -128 * code_sum;
    // The minimums multiply the sum of the quantized activations, not of x: the codes carry
    // the rounding of x into both terms, so the error is that of sum(w * (x' - x)) with the
    // centred weights, as for int8 (with float sums the min term cancels the large
    // q * scale term imperfectly: 1.7% relative error on random rows against 0.5%).
    if (w.bits == 4) a.group_sums[static_cast<size_t>(b * 32 / w.group)] += d * static_cast<float>(code_sum);
  }
}

// Lane l of a 64-byte load holds block l / (16 / lane_blocks) of the load; with groups of
// `group` columns its weight scale is scale[first + ((l / lanes_per_block) * 32) / group].
inline __m512i scale_index(int64_t lane_blocks, int64_t group) {
  alignas(64) int32_t idx[16];
  const int64_t lanes = 16 / lane_blocks;
  for (int l = 0; l < 16; ++l) idx[l] = static_cast<int32_t>(((l / lanes) * 32) / group);
  return _mm512_load_si512(idx);
}

inline void prefetch_row(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + 4096, _MM_HINT_T0);
}

// R weight rows starting at n of an int4 weight, times C quantized activation rows a[0..C):
// out[r][j].  Each 64-byte weight load is unpacked once and multiplied with every row's codes.
template <int R, int C>
inline void gemv_int4_rows(const Q8Act* a, const QuantWeight& w, int64_t n, __m512i sidx,
                           float (&out)[R][C]) {
  const int64_t K = w.K, groups = K / w.group, row_bytes = K / 2;
  const int64_t loads = (row_bytes + 63) / 64;
  const int64_t groups_per_load = std::max<int64_t>(1, 128 / w.group);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const uint8_t* q = static_cast<const uint8_t*>(w.q) + n * row_bytes;
  const uint16_t* sc = w.scales + n * groups;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < loads; ++c) {
    const int64_t nbytes = std::min<int64_t>(64, row_bytes - c * 64);
    const __mmask64 bmask = nbytes == 64 ? ~__mmask64(0) : ((__mmask64(1) << nbytes) - 1);
    const int64_t g0 = (c * 128) / w.group;
    const int64_t ng = std::min<int64_t>(groups_per_load, groups - g0);
    const __mmask8 smask = static_cast<__mmask8>((1u << ng) - 1);
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = q + r * row_bytes + c * 64;
      prefetch_row(p);
      const __m512i raw = _mm512_maskz_loadu_epi8(bmask, p);
      const __m512i lo = _mm512_and_si512(raw, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      const __m128 s4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(smask, sc + r * groups + g0));
      const __m512 ws = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(s4));
      for (int j = 0; j < C; ++j) {
        const int8_t* codes = a[j].codes.data() + c * 128;
        const __m512i isum = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(codes)), hi,
            _mm512_loadu_si512(codes + 64));
        const __m512 dx = _mm512_loadu_ps(a[j].scale_lanes.data() + c * 16);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws, dx), acc[r][j]);
      }
    }
  }
  const uint16_t* mn = w.mins + n * groups;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      __m512 macc = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 m =
            static_cast<__mmask16>(groups - g >= 16 ? 0xffffu : ((1u << (groups - g)) - 1));
        const __m512 mv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, mn + r * groups + g));
        macc = _mm512_fmadd_ps(mv, _mm512_loadu_ps(a[j].group_sums.data() + g), macc);
      }
      out[r][j] = _mm512_reduce_add_ps(acc[r][j]) + _mm512_reduce_add_ps(macc);
    }
}

// The same for an int8 weight (group 32, or one scale per row: group = K).
template <int R, int C>
inline void gemv_int8_rows(const Q8Act* a, const QuantWeight& w, int64_t n, __m512i sidx,
                           float (&out)[R][C]) {
  const int64_t K = w.K, groups = K / w.group;
  const int64_t loads = (K + 63) / 64;
  const bool per_row = w.group == K;
  const int64_t groups_per_load = std::max<int64_t>(1, 64 / w.group);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* q = static_cast<const int8_t*>(w.q) + n * K;
  const uint16_t* sc = w.scales + n * groups;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < loads; ++c) {
    const int64_t nbytes = std::min<int64_t>(64, K - c * 64);
    const __mmask64 bmask = nbytes == 64 ? ~__mmask64(0) : ((__mmask64(1) << nbytes) - 1);
    const int64_t g0 = per_row ? 0 : (c * 64) / w.group;
    const int64_t ng = per_row ? 1 : std::min<int64_t>(groups_per_load, groups - g0);
    const __mmask8 smask = static_cast<__mmask8>((1u << ng) - 1);
    for (int r = 0; r < R; ++r) {
      const int8_t* p = q + r * K + c * 64;
      prefetch_row(p);
      // Masked-off bytes load as 0 and flip to 128, against activation codes padded with 0.
      const __m512i wu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bmask, p), flip);
      __m512 ws = _mm512_set1_ps(1.f);
      if (!per_row) {
        const __m128 s4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(smask, sc + r * groups + g0));
        ws = _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(s4));
      }
      for (int j = 0; j < C; ++j) {
        const __m512i isum = _mm512_dpbusd_epi32(
            _mm512_loadu_si512(a[j].bias_lanes.data() + c * 16), wu,
            _mm512_loadu_si512(a[j].codes.data() + c * 64));
        const __m512 dx = _mm512_loadu_ps(a[j].scale_lanes.data() + c * 16);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                    per_row ? dx : _mm512_mul_ps(ws, dx), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      float v = _mm512_reduce_add_ps(acc[r][j]);
      if (per_row) v *= _cvtsh_ss(sc[r * groups]);
      out[r][j] = v;
    }
}

// Rows [n, n + R) of the output for activation rows [m0, m0 + C).
template <int R, int C>
inline void rows_block(const std::vector<Q8Act>& acts, int64_t m0, const QuantWeight& w,
                       int64_t n, __m512i sidx, float (&out)[R][C]) {
  if (w.bits == 4)
    gemv_int4_rows<R, C>(acts.data() + m0, w, n, sidx, out);
  else
    gemv_int8_rows<R, C>(acts.data() + m0, w, n, sidx, out);
}

template <int R, typename Put>
void weight_rows(const std::vector<Q8Act>& acts, int64_t M, const QuantWeight& w, int64_t n,
                 __m512i sidx, const Put& put) {
  int64_t m = 0;
  for (; m + ACOLS <= M; m += ACOLS) {
    float out[R][ACOLS];
    rows_block<R, ACOLS>(acts, m, w, n, sidx, out);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < ACOLS; ++j) put(m + j, n + r, out[r][j]);
  }
  for (; m < M; ++m) {  // the last 1-3 activation rows one at a time
    float out[R][1];
    rows_block<R, 1>(acts, m, w, n, sidx, out);
    for (int r = 0; r < R; ++r) put(m, n + r, out[r][0]);
  }
}

}  // namespace

bool quant_gemv_q8act(const float* x, int64_t M, const QuantWeight& w, const float* bias,
                      void* y, bool y_bf16) {
  if (w.K % 32 != 0 || M < 1) return false;
  // int8 weights past 4 rows: the float path on the rounded values is faster (SmolLM2's
  // projections and head, 2 threads: 4.4 vs 3.5 ms at 8 rows, 17.0 vs 11.2 ms at 32); int4
  // stays ahead up to 32 rows (2.8 vs 4.0 ms at 8, 11.1 vs 11.3 ms at 32).
  if (w.bits == 8 && M > 4) return false;
  if (w.bits == 4 && !(w.group == 32 || w.group == 64 || w.group == 128)) return false;
  if (w.bits == 8 && !(w.group == 32 || w.group == w.K)) return false;
  thread_local std::vector<Q8Act> acts;  // the caller's thread quantizes; workers only read
  if (static_cast<int64_t>(acts.size()) < M) acts.resize(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) quantize_activation(x + m * w.K, w, acts[static_cast<size_t>(m)]);
  const __m512i sidx = scale_index(w.bits == 4 ? 4 : 2, w.group == w.K ? 1 << 30 : w.group);
  const std::vector<Q8Act>& a = acts;
  auto put = [&](int64_t m, int64_t n, float v) {
    v += bias ? bias[n] : 0.f;
    const int64_t i = m * w.N + n;
    if (y_bf16) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      if ((bits & 0x7fffffffu) > 0x7f800000u) {
        static_cast<uint16_t*>(y)[i] = static_cast<uint16_t>((bits >> 16) | 0x40u);
      } else {
        bits += 0x7fffu + ((bits >> 16) & 1u);
        static_cast<uint16_t*>(y)[i] = static_cast<uint16_t>(bits >> 16);
      }
    } else {
      static_cast<float*>(y)[i] = v;
    }
  };
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t blocks = (w.N + QROWS - 1) / QROWS;
  const int64_t grain = std::max<int64_t>(1, (blocks + threads - 1) / threads);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t n1 = std::min(w.N, b1 * QROWS);
    int64_t n = b0 * QROWS;
    for (; n + QROWS <= n1; n += QROWS) weight_rows<QROWS>(a, M, w, n, sidx, put);
    for (; n < n1; ++n) weight_rows<1>(a, M, w, n, sidx, put);
  });
  return true;
}

#else

bool quant_gemv_q8act_supported() { return false; }

bool quant_gemv_q8act(const float*, int64_t, const QuantWeight&, const float*, void*, bool) {
  return false;
}

#endif

}  // namespace infbench_cpu
