// Raw-pointer CPU kernels behind infbench's `cpu` backend (see kernels/cpu_ops.py).
//
// Each kernel lives in its own translation unit that includes only this header and
// <ATen/Parallel.h>, so a rebuild after editing one kernel stays quick; the tensor
// checks and the Python bindings are in bindings.cpp.  bf16 values travel as uint16_t
// (the upper half of an IEEE float32).  The build uses -march=native on the machine that
// runs it, so `#ifdef __AVX512BF16__` and friends describe the CPU the code runs on.
#pragma once
#include <cstdint>

namespace infbench_cpu {

// y (M, N) = x (M, K) @ w (N, K)^T [+ bias (N)], fp32 accumulation.
// x_bf16/w_bf16 select the element type of x and w (float32 when false);
// y is bf16 when y_bf16, else float32.  Rows of w are split across threads.
void linear(const void* x, const void* w, const float* bias, void* y, int64_t M, int64_t N,
            int64_t K, int64_t ldx, bool bf16, bool y_bf16);

}  // namespace infbench_cpu
