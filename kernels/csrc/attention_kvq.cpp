// Paged attention on the CPU over an int8 KV cache (kv_quant.h): decode and varlen causal
// prefill through paged_attention.h's body, the one attention.cpp runs over a float cache,
// instantiated for int8 codes: one byte per cached value read in place, converted to fp32
// lanes as it is loaded (vec::load of cpu_common.h), each key's scale multiplying its
// scores and each value's its softmax weight.  All math is fp32.
#include "kv_quant.h"
#include "paged_attention.h"

namespace infbench_cpu {

void paged_decode_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_seq,
                                 int64_t q_stride_tok, int64_t q_stride_head, void* out,
                                 int64_t batch, int64_t num_q) {
  run_decode(p.a, p, q, q_stride_seq, q_stride_tok, q_stride_head, out, batch, num_q);
}

void prefill_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_tok,
                            int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                            int64_t num_seqs) {
  run_prefill(p.a, p, q, q_stride_tok, q_stride_head, out, cu_seqlens_q, num_seqs);
}

}  // namespace infbench_cpu
