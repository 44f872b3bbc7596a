// The int8 KV cache on the CPU (kernels/kv_quant.py describes the format): the paged
// int8 K and V pools (num_blocks, block_size, Hkv, D|Dv) with one float32 scale per
// token per KV head beside each, (num_blocks, block_size, Hkv).  store_kv_quant.cpp
// quantizes rows on the way in; attention_kvq.cpp reads them in place, one byte per
// value, folding each key's scale into its score and each value's into its weight (the
// float cache's attention body, paged_attention.h, instantiated for int8 codes).
// The Python bindings are in bindings_kvq.cpp (bind_kv_quant).
#pragma once
#include <cstdint>

#include "cpu_kernels.h"

namespace infbench_cpu {

// A paged int8 cache: the PagedAttention fields describe the int8 pools (strides in
// elements, which are bytes here) and q's dtype; the scale strides are in floats.
struct PagedAttentionInt8 {
  PagedAttention a;
  const float* k_scales;
  const float* v_scales;
  int64_t ks_stride_block, ks_stride_slot, ks_stride_head;
  int64_t vs_stride_block, vs_stride_slot, vs_stride_head;
};

// paged_decode_attention / prefill_attention of cpu_kernels.h over an int8 cache.
void paged_decode_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_seq,
                                 int64_t q_stride_tok, int64_t q_stride_head, void* out,
                                 int64_t batch, int64_t num_q);
void prefill_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_tok,
                            int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                            int64_t num_seqs);

// store_kv of cpu_kernels.h into an int8 cache: key/value rows (float32, bfloat16 or
// float16: dtype) quantized per token per head, each scale written beside its row.
struct KVStoreInt8 {
  KVStore s;  // elem_size unused: the source is `dtype`, the caches int8
  DType dtype;
  float* k_scales;
  int64_t ks_stride_block, ks_stride_slot, ks_stride_head;
  float* v_scales;
  int64_t vs_stride_block, vs_stride_slot, vs_stride_head;
};
void store_kv_int8(const KVStoreInt8& p, const int64_t* slot_mapping, int64_t num_tokens);

}  // namespace infbench_cpu
