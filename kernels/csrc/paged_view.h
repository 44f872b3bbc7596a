// The tensor side of PagedAttention (cpu_kernels.h), shared by the bindings of the float
// cache (bindings.cpp), the int8 cache (bindings_kvq.cpp) and the fused decode layer
// (decode_layer.cpp): the shape checks of a paged cache and the fields read from it.
#pragma once
#include <torch/extension.h>

#include "cpu_kernels.h"

namespace infbench_cpu {

// Checks the caches (num_blocks, block_size, Hkv, D|Dv), the (B, max_blocks) int32 tables
// and that every context fits its table; not the element types (float and int8 caches
// differ there).  Returns the context lengths.
inline const int32_t* check_paged(const char* op, const torch::Tensor& q,
                                  const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                  const torch::Tensor& block_tables,
                                  const torch::Tensor& context_lens, int64_t num_q_heads,
                                  const c10::optional<int64_t>& window) {
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.device().is_cpu() &&
              block_tables.device().is_cpu(), op, ": caches and tables must be CPU tensors");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4,
              op, ": caches are (num_blocks, block_size, heads, dim)");
  TORCH_CHECK(k_cache.size(0) == v_cache.size(0) && k_cache.size(1) == v_cache.size(1) &&
              k_cache.size(2) == v_cache.size(2), op, ": k_cache and v_cache shapes differ");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, op, ": cache rows must be contiguous");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == torch::kInt32 &&
              block_tables.stride(1) == 1, op, ": block_tables must be (B, max_blocks) int32 rows");
  TORCH_CHECK(q.size(-1) == k_cache.size(3), op, ": q and k_cache head dims differ");
  const int64_t num_kv_heads = k_cache.size(2);
  TORCH_CHECK(num_kv_heads > 0 && num_q_heads % num_kv_heads == 0, op, ": ", num_q_heads,
              " query heads are not a multiple of ", num_kv_heads, " KV heads");
  TORCH_CHECK(!window.has_value() || *window > 0, op, ": window must be a positive token count");
  // Every context must fit its table: the kernels read table entries up to it.
  const int64_t capacity = block_tables.size(1) * k_cache.size(1);
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < context_lens.size(0); ++b)
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= capacity, op, ": context length ", lens[b],
                " of sequence ", b, " does not fit its block table (", capacity, " slots)");
  return lens;
}

// The fields of PagedAttention for caches and tables already checked.
inline PagedAttention paged_view(const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                 const torch::Tensor& block_tables, const int32_t* context_lens,
                                 int64_t num_q_heads, double scale, int64_t window,
                                 DType dtype) {
  PagedAttention a{};
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  a.k_stride_block = k_cache.stride(0);
  a.k_stride_slot = k_cache.stride(1);
  a.k_stride_head = k_cache.stride(2);
  a.v_stride_block = v_cache.stride(0);
  a.v_stride_slot = v_cache.stride(1);
  a.v_stride_head = v_cache.stride(2);
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.table_stride = block_tables.stride(0);
  a.context_lens = context_lens;
  a.block_size = k_cache.size(1);
  a.num_q_heads = num_q_heads;
  a.num_kv_heads = k_cache.size(2);
  a.head_dim = k_cache.size(3);
  a.v_head_dim = v_cache.size(3);
  a.scale = static_cast<float>(scale);
  a.window = window;
  a.dtype = dtype;
  return a;
}

}  // namespace infbench_cpu
