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
};

// y (M, N) = x (M, K) fp32 contiguous @ dequant(w)^T [+ bias], y bf16 when y_bf16.
void quant_linear(const float* x, const QuantWeight& w, const float* bias, void* y, int64_t M,
                  bool y_bf16);

// out (N, K) = dequant(w), fp32 or bf16 (for the prefill GEMM).
void quant_dequantize(const QuantWeight& w, void* out, bool out_bf16);

}  // namespace infbench_cpu
