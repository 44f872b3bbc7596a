// Weight-only int8 / int4 projections on the CPU (linear.cpp), in the stored format of
// kernels/quant_format.py: int8 codes with fp16 scales per group (group = K: per row);
// int4 nibbles in GGUF block order (byte j of a 32-column block holds column j low,
// column j + 16 high) with an fp16 scale and an fp16 min per group: w = q * scale + min.
#pragma once
#include <cstdint>

namespace infbench_cpu {

struct QuantWeight {
  int bits;               // 8 or 4
  const void* q;          // int8 (N, K) or uint8 (N, K / 2)
  const uint16_t* scales; // fp16 (N, K / group)
  const uint16_t* mins;   // fp16 (N, K / group); int4 only
  int64_t N, K, group;
  // int8 activations: VNNI dot products (linear_q8act.cpp) where the CPU has AVX512-VNNI
  // (int4 up to 32 rows, int8 up to 4); otherwise the float path on the rounded values.
  bool act_int8 = false;
};

// y (M, N) = x (M, K) fp32 contiguous @ dequant(w)^T [+ bias], y bf16 when y_bf16.
void quant_linear(const float* x, const QuantWeight& w, const float* bias, void* y, int64_t M,
                  bool y_bf16);

// linear_q8act.cpp: y (M, N) = int8(x (M, K)) @ dequant(w)^T [+ bias]; false (nothing
// written) when this build or this weight's group size has no such path.
bool quant_gemv_q8act(const float* x, int64_t M, const QuantWeight& w, const float* bias,
                      void* y, bool y_bf16);
bool quant_gemv_q8act_supported();
// out (M, K) = x (M, K) with each 32-column block rounded to int8 codes times its scale
// (what quant_gemv_q8act multiplies; a shorter last block when 32 does not divide K).
void quantize_activation_rows(const float* x, float* out, int64_t M, int64_t K);

// out (N, K) = dequant(w), fp32 or bf16 (for the prefill GEMM).
void quant_dequantize(const QuantWeight& w, void* out, bool out_bf16);

}  // namespace infbench_cpu
