// RMSNorm with an optional fused residual add, rounded the way HF LlamaRMSNorm rounds:
//   x = x + residual                      (in x's dtype)
//   h = x.float() * rsqrt(mean(x.float()^2) + eps)
//   out = weight * h.to(x.dtype)          (fp32 product, then x's dtype)
// One row per work item; a one-token decode norm runs inline on the calling thread.
#include "cpu_kernels.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t MIN_PARALLEL_WORK = 1 << 16;  // elements below which one thread runs

template <typename T>
inline void add_row(const T* x, const T* y, T* out, int64_t n) {  // out = T(x + y)
  int64_t i = 0;
  for (; i + vec::W <= n; i += vec::W) vec::store(out + i, vec::add(vec::load(x + i), vec::load(y + i)));
  if (i < n) vec::store(out + i, vec::add(vec::load(x + i, n - i), vec::load(y + i, n - i)), n - i);
}

template <typename T, typename Wt>
void rmsnorm_row(const T* x, const T* residual, const Wt* w, T* out, T* residual_out,
                 int64_t n, float eps) {
  if (residual != nullptr) {  // the norm reads the rounded sum, as the reference does
    add_row(x, residual, residual_out, n);
    x = residual_out;
  }
  vec::V ss = vec::zero();
  int64_t i = 0;
  for (; i + vec::W <= n; i += vec::W) {
    const vec::V v = vec::load(x + i);
    ss = vec::fma(v, v, ss);
  }
  if (i < n) {
    const vec::V v = vec::load(x + i, n - i);
    ss = vec::fma(v, v, ss);
  }
  const float inv = 1.f / std::sqrt(vec::sum(ss) / static_cast<float>(n) + eps);
  const vec::V inv_v = vec::set1(inv);
  for (i = 0; i + vec::W <= n; i += vec::W) {
    const vec::V h = vec::round_to<T>(vec::mul(vec::load(x + i), inv_v));
    vec::store(out + i, vec::mul(vec::load(w + i), h));
  }
  if (i < n) {
    const vec::V h = vec::round_to<T>(vec::mul(vec::load(x + i, n - i), inv_v));
    vec::store(out + i, vec::mul(vec::load(w + i, n - i), h), n - i);
  }
}

}  // namespace

void rmsnorm(DType dtype, bool weight_f32, const void* x, int64_t x_stride,
             const void* residual, int64_t residual_stride, const void* weight, void* out,
             void* residual_out, int64_t rows, int64_t hidden, float eps) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto weight_tag) {
      using Wt = decltype(weight_tag);
      for_each_item(rows, rows * hidden, MIN_PARALLEL_WORK, [&](int64_t r) {
        rmsnorm_row<T, Wt>(
            static_cast<const T*>(x) + r * x_stride,
            residual ? static_cast<const T*>(residual) + r * residual_stride : nullptr,
            static_cast<const Wt*>(weight), static_cast<T*>(out) + r * hidden,
            residual_out ? static_cast<T*>(residual_out) + r * hidden : nullptr, hidden, eps);
      });
    };
    if (weight_f32) run(float{});
    else run(T{});
  });
}

}  // namespace infbench_cpu
