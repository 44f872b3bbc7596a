// Paged attention on the CPU over a float cache (K and V in q's dtype): decode and
// variable-length causal prefill.  The body (work items, online softmax, prefetch) is
// paged_attention.h's, which attention_kvq.cpp instantiates for the int8 cache.
#include "paged_attention.h"

namespace infbench_cpu {

void paged_decode_attention(const PagedAttention& a, const void* q, int64_t q_stride_seq,
                            int64_t q_stride_tok, int64_t q_stride_head, void* out,
                            int64_t batch, int64_t num_q) {
  run_decode(a, NoScales{}, q, q_stride_seq, q_stride_tok, q_stride_head, out, batch, num_q);
}

void prefill_attention(const PagedAttention& a, const void* q, int64_t q_stride_tok,
                       int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                       int64_t num_seqs) {
  run_prefill(a, NoScales{}, q, q_stride_tok, q_stride_head, out, cu_seqlens_q, num_seqs);
}

}  // namespace infbench_cpu
