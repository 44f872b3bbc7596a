// Writes the keys and values of the step's new tokens into the paged KV cache: token t
// goes to block slot_mapping[t] / block_size, offset slot_mapping[t] % block_size; a
// negative slot is padding and is skipped.  Plain byte copies (any element type), one
// memcpy per token when its heads are contiguous on both sides.
#include "cpu_kernels.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t MIN_PARALLEL_BYTES = 1 << 18;  // bytes below which one thread copies

// Copies num_heads rows of `bytes` bytes; strides in bytes.
inline void copy_heads(char* dst, int64_t dst_stride, const char* src, int64_t src_stride,
                       int64_t num_heads, int64_t bytes) {
  if (dst_stride == bytes && src_stride == bytes) {
    std::memcpy(dst, src, static_cast<size_t>(num_heads * bytes));
    return;
  }
  for (int64_t h = 0; h < num_heads; ++h)
    std::memcpy(dst + h * dst_stride, src + h * src_stride, static_cast<size_t>(bytes));
}

}  // namespace

void store_kv(const KVStore& s, const int64_t* slot_mapping, int64_t num_tokens) {
  const int64_t e = s.elem_size;
  const int64_t k_bytes = s.head_dim * e, v_bytes = s.v_head_dim * e;
  const int64_t work = num_tokens * s.num_kv_heads * (k_bytes + v_bytes);
  for_each_item(num_tokens, work, MIN_PARALLEL_BYTES, [&](int64_t t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;  // padding token
    const int64_t block = slot / s.block_size, offset = slot % s.block_size;
    copy_heads(static_cast<char*>(s.k_cache) + (block * s.kc_stride_block + offset * s.kc_stride_slot) * e,
               s.kc_stride_head * e,
               static_cast<const char*>(s.key) + t * s.key_stride_tok * e, s.key_stride_head * e,
               s.num_kv_heads, k_bytes);
    copy_heads(static_cast<char*>(s.v_cache) + (block * s.vc_stride_block + offset * s.vc_stride_slot) * e,
               s.vc_stride_head * e,
               static_cast<const char*>(s.value) + t * s.value_stride_tok * e,
               s.value_stride_head * e, s.num_kv_heads, v_bytes);
  });
}

}  // namespace infbench_cpu
