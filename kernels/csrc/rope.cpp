// Rotary position embedding, rotate-half layout, in place on strided q and k views (the
// slices of a fused qkv projection): for i < rot_dim / 2, with c, s the cos and sin of
// the token's position,  x_i' = x_i c_i - x_{i+half} s_i,  x_{i+half}' = x_{i+half} c_i + x_i s_i,
// in fp32, rounded once to the tensor's dtype.  One token per work item.
#include "cpu_kernels.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t MIN_PARALLEL_WORK = 1 << 16;  // rotated elements below which one thread runs

template <typename T, typename C>
inline void rotate_head(T* x, const C* cos, const C* sin, int64_t half) {
  for (int64_t i = 0; i < half; i += vec::W) {
    const int64_t w = std::min(vec::W, half - i);
    const bool full = w == vec::W;
    const vec::V x1 = full ? vec::load(x + i) : vec::load(x + i, w);
    const vec::V x2 = full ? vec::load(x + half + i) : vec::load(x + half + i, w);
    const vec::V c = full ? vec::load(cos + i) : vec::load(cos + i, w);
    const vec::V s = full ? vec::load(sin + i) : vec::load(sin + i, w);
    const vec::V y1 = vec::sub(vec::mul(x1, c), vec::mul(x2, s));
    const vec::V y2 = vec::add(vec::mul(x2, c), vec::mul(x1, s));
    if (full) {
      vec::store(x + i, y1);
      vec::store(x + half + i, y2);
    } else {
      vec::store(x + i, y1, w);
      vec::store(x + half + i, y2, w);
    }
  }
}

}  // namespace

void rope(DType dtype, bool cache_f32, void* q, int64_t q_stride_tok, int64_t q_stride_head,
          int64_t num_q_heads, void* k, int64_t k_stride_tok, int64_t k_stride_head,
          int64_t num_kv_heads, const int64_t* positions, const void* cos_sin,
          int64_t cos_sin_stride, int64_t num_tokens, int64_t rot_dim) {
  const int64_t half = rot_dim / 2;
  const int64_t work = num_tokens * (num_q_heads + num_kv_heads) * rot_dim;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto cache_tag) {
      using C = decltype(cache_tag);
      for_each_item(num_tokens, work, MIN_PARALLEL_WORK, [&](int64_t t) {
        const C* cos = static_cast<const C*>(cos_sin) + positions[t] * cos_sin_stride;
        const C* sin = cos + half;
        T* qt = static_cast<T*>(q) + t * q_stride_tok;
        for (int64_t h = 0; h < num_q_heads; ++h) rotate_head(qt + h * q_stride_head, cos, sin, half);
        T* kt = static_cast<T*>(k) + t * k_stride_tok;
        for (int64_t h = 0; h < num_kv_heads; ++h) rotate_head(kt + h * k_stride_head, cos, sin, half);
      });
    };
    if (cache_f32) run(float{});
    else run(T{});
  });
}

}  // namespace infbench_cpu
