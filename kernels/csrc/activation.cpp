// SwiGLU activation, silu(gate) * up, for the fused gate_up projection output x (T, 2I):
// gate = x[:, :I], up = x[:, I:].  fp32 math (silu(g) = g / (1 + exp(-g)), as torch's
// CPU kernel writes it), rounded once to x's dtype.  One row per work item.
#include "cpu_kernels.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t MIN_PARALLEL_WORK = 1 << 15;  // outputs below which one thread runs

template <typename T>
inline void silu_mul_row(const T* gate, const T* up, T* out, int64_t n) {
  const vec::V one = vec::set1(1.f), neg_one = vec::set1(-1.f);
  for (int64_t i = 0; i < n; i += vec::W) {
    const int64_t w = std::min(vec::W, n - i);
    const bool full = w == vec::W;
    const vec::V g = full ? vec::load(gate + i) : vec::load(gate + i, w);
    const vec::V u = full ? vec::load(up + i) : vec::load(up + i, w);
    const vec::V silu = vec::div(g, vec::add(one, vec::exp(vec::mul(g, neg_one))));
    if (full) vec::store(out + i, vec::mul(silu, u));
    else vec::store(out + i, vec::mul(silu, u), w);
  }
}

}  // namespace

void silu_and_mul(DType dtype, const void* x, int64_t x_stride, void* out, int64_t rows,
                  int64_t inter_size) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    for_each_item(rows, rows * inter_size, MIN_PARALLEL_WORK, [&](int64_t r) {
      const T* row = static_cast<const T*>(x) + r * x_stride;
      silu_mul_row(row, row + inter_size, static_cast<T*>(out) + r * inter_size, inter_size);
    });
  });
}

}  // namespace infbench_cpu
