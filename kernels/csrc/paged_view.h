// The tensor side of PagedAttention (cpu_kernels.h), shared by the bindings of the float
// cache (bindings.cpp), the int8 cache (bindings_kvq.cpp) and the fused decode layer
// (decode_layer.cpp): the shape checks of a paged cache, the fields read from it, and the
// argument handling of the attention ops, one body for both caches.
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

inline void check_cpu(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor");
}

// An int32 vector as the kernels read it (converted only when it is not one already).
inline torch::Tensor int32_vector(const torch::Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  TORCH_CHECK(t.dim() == 1, op, ": ", name, " must be 1-D");
  return t.scalar_type() == torch::kInt32 && t.is_contiguous() ? t : t.to(torch::kInt32).contiguous();
}

// ---- the attention ops over either cache -------------------------------------------
// Cache is what differs between the float cache (bindings.cpp) and the int8 one
// (bindings_kvq.cpp): it holds the k_cache and v_cache tensors (and the scales), and
//   args(op, q, block_tables, context_lens, num_q_heads, scale, window) checks them and
//     returns the kernel's arguments (PagedAttention, PagedAttentionInt8);
//   Cache::decode and Cache::prefill are the kernels of cpu_kernels.h / kv_quant.h.

// q (B, Hq, D) or (B, Q, Hq, D) over the paged cache -> q's shape with Dv, in q's dtype.
template <typename Cache>
torch::Tensor decode_attention_op(const char* op, const Cache& cache, const torch::Tensor& q,
                                  const torch::Tensor& block_tables,
                                  const torch::Tensor& context_lens, double scale,
                                  const c10::optional<int64_t>& window) {
  check_cpu(q, op, "q");
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4, op, ": q must be (B, Hq, D) or (B, Q, Hq, D)");
  const bool is_single = q.dim() == 3;
  auto q4 = is_single ? q.unsqueeze(1) : q;
  if (q4.stride(3) != 1) q4 = q4.contiguous();
  const int64_t batch = q4.size(0), num_q = q4.size(1), num_heads = q4.size(2);
  auto lens = int32_vector(context_lens, op, "context_lens");
  TORCH_CHECK(lens.size(0) == batch && block_tables.size(0) == batch,
              op, ": context_lens and block_tables must have one row per sequence");
  const auto args = cache.args(op, q4, block_tables, lens, num_heads, scale, window);
  const int64_t v_head_dim = cache.v_cache.size(3);
  auto out = is_single ? torch::empty({batch, num_heads, v_head_dim}, q.options())
                       : torch::empty({batch, num_q, num_heads, v_head_dim}, q.options());
  Cache::decode(args, q4.data_ptr(), q4.stride(0), q4.stride(1), q4.stride(2), out.data_ptr(),
                batch, num_q);
  return out;
}

// Causal attention of the new tokens q (T, Hq, D) of B sequences -> (T, Hq, Dv).
template <typename Cache>
torch::Tensor prefill_attention_op(const char* op, const Cache& cache, const torch::Tensor& q,
                                   const torch::Tensor& cu_seqlens_q,
                                   const torch::Tensor& context_lens,
                                   const torch::Tensor& block_tables, double scale,
                                   const c10::optional<int64_t>& window) {
  check_cpu(q, op, "q");
  TORCH_CHECK(q.dim() == 3, op, ": q must be (T, Hq, D)");
  auto qc = q.stride(2) == 1 ? q : q.contiguous();
  auto lens = int32_vector(context_lens, op, "context_lens");
  auto cu = int32_vector(cu_seqlens_q, op, "cu_seqlens_q");
  const int64_t batch = lens.size(0);
  TORCH_CHECK(cu.size(0) == batch + 1 && block_tables.size(0) == batch,
              op, ": expected cu_seqlens_q (B+1,) and block_tables (B, max_blocks)");
  const int32_t* starts = cu.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(starts[b] >= 0 && starts[b] <= starts[b + 1], op, ": cu_seqlens_q must not decrease");
  TORCH_CHECK(batch == 0 || starts[batch] <= q.size(0), op, ": cu_seqlens_q runs past q's rows");
  const auto args = cache.args(op, qc, block_tables, lens, q.size(1), scale, window);
  auto out = torch::empty({q.size(0), q.size(1), cache.v_cache.size(3)}, q.options());
  if (q.size(0) == 0 || batch == 0) return out;
  Cache::prefill(args, qc.data_ptr(), qc.stride(0), qc.stride(1), out.data_ptr(), starts, batch);
  return out;
}

}  // namespace infbench_cpu
