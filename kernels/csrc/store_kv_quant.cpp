// Writes the step's new keys and values into an int8 paged KV cache (kv_quant.h): per
// token and KV head, scale = max|x| / 127 and q = round(x / scale), half to even and
// clamped to +-127 (an all-zero row stores scale 0 and zeros).  The same IEEE division
// and rounding as kernels/kv_quant.py's reference, so both store identical bytes.
#include "kv_quant.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t MIN_PARALLEL_VALUES = 1 << 16;  // values below which one thread stores
constexpr float QMAX = 127.f;

// One row of n values: q[i] = round(x[i] / scale), returns scale = max|x| / 127.
template <typename T>
inline float quantize_row(const T* x, int64_t n, int8_t* q) {
  float* xf = scratch(n);
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    xf[i] = to_float(x[i]);
    amax = std::max(amax, std::fabs(xf[i]));
  }
  const float scale = amax / QMAX;
  const float div = scale == 0.f ? 1.f : scale;
  for (int64_t i = 0; i < n; ++i) {
    // nearbyint in the default rounding mode: half to even, as torch.round.
    const float r = std::nearbyint(xf[i] / div);
    q[i] = static_cast<int8_t>(std::min(QMAX, std::max(-QMAX, r)));
  }
  return scale;
}

}  // namespace

void store_kv_int8(const KVStoreInt8& p, const int64_t* slot_mapping, int64_t num_tokens) {
  const KVStore& s = p.s;
  const int64_t work = num_tokens * s.num_kv_heads * (s.head_dim + s.v_head_dim);
  dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* key = static_cast<const T*>(s.key);
    const T* value = static_cast<const T*>(s.value);
    int8_t* k_cache = static_cast<int8_t*>(s.k_cache);
    int8_t* v_cache = static_cast<int8_t*>(s.v_cache);
    for_each_item(num_tokens, work, MIN_PARALLEL_VALUES, [&](int64_t t) {
      const int64_t slot = slot_mapping[t];
      if (slot < 0) return;  // padding token
      const int64_t block = slot / s.block_size, offset = slot % s.block_size;
      for (int64_t h = 0; h < s.num_kv_heads; ++h) {
        p.k_scales[block * p.ks_stride_block + offset * p.ks_stride_slot + h * p.ks_stride_head] =
            quantize_row(key + t * s.key_stride_tok + h * s.key_stride_head, s.head_dim,
                         k_cache + block * s.kc_stride_block + offset * s.kc_stride_slot +
                             h * s.kc_stride_head);
        p.v_scales[block * p.vs_stride_block + offset * p.vs_stride_slot + h * p.vs_stride_head] =
            quantize_row(value + t * s.value_stride_tok + h * s.value_stride_head, s.v_head_dim,
                         v_cache + block * s.vc_stride_block + offset * s.vc_stride_slot +
                             h * s.vc_stride_head);
      }
    });
  });
}

}  // namespace infbench_cpu
