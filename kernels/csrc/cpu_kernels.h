// Raw-pointer CPU kernels behind infbench's `cpu` backend (see kernels/cpu_ops.py).
//
// Each kernel lives in its own translation unit that includes only this header and
// <ATen/Parallel.h>, so a rebuild after editing one kernel stays quick; the tensor
// checks and the Python bindings are in bindings.cpp.  bf16 values travel as uint16_t
// (the upper half of an IEEE float32).  The build uses -march=native on the machine that
// runs it, so `#ifdef __AVX512BF16__` and friends describe the CPU the code runs on.
#pragma once
#include <cstdint>

namespace infbench_cpu {

// y (M, N) = x (M, K) @ w (N, K)^T [+ bias (N)], fp32 accumulation.
// x_bf16/w_bf16 select the element type of x and w (float32 when false);
// y is bf16 when y_bf16, else float32.  Rows of w are split across threads.
void linear(const void* x, const void* w, const float* bias, void* y, int64_t M, int64_t N,
            int64_t K, int64_t ldx, bool bf16, bool y_bf16);

// ---- per-layer ops (attention.cpp, norm.cpp, rope.cpp, activation.cpp, store_kv.cpp) ----
// Strides are in elements; the last dimension of every tensor is contiguous.  Element
// types: DType (cpu_common.h maps them to float / bf16 / fp16); fp32 math throughout.

enum class DType : int { Float32 = 0, BFloat16 = 1, Float16 = 2 };

// A paged KV cache (num_blocks, block_size, Hkv, D|Dv) and the per-sequence tables.
struct PagedAttention {
  const void* k_cache;
  const void* v_cache;
  int64_t k_stride_block, k_stride_slot, k_stride_head;
  int64_t v_stride_block, v_stride_slot, v_stride_head;
  const int32_t* block_tables;  // (B, max_blocks), row stride table_stride
  int64_t table_stride;
  const int32_t* context_lens;  // (B,) tokens per sequence, the new ones included
  int64_t block_size, num_q_heads, num_kv_heads, head_dim, v_head_dim;
  float scale;
  int64_t window;  // keys with query_pos - key_pos >= window are hidden; <= 0: no window
  DType dtype;     // of q, the caches and the output
};

// out (B, Q, Hq, Dv) contiguous = attention of the last Q tokens of each sequence, q
// (B, Q, Hq, D) with strides (q_stride_seq, q_stride_tok, q_stride_head).
void paged_decode_attention(const PagedAttention& a, const void* q, int64_t q_stride_seq,
                            int64_t q_stride_tok, int64_t q_stride_head, void* out,
                            int64_t batch, int64_t num_q);

// out (T, Hq, Dv) contiguous = causal attention of the new tokens q (T, Hq, D) of B
// sequences, sequence b owning rows cu_seqlens_q[b]:cu_seqlens_q[b + 1].
void prefill_attention(const PagedAttention& a, const void* q, int64_t q_stride_tok,
                       int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                       int64_t num_seqs);

// out (rows, H) = HF LlamaRMSNorm of x [+ residual]; with a residual, residual_out (rows, H)
// gets x + residual (in x's dtype) and the norm is of that.  weight is float32 when
// weight_f32, else x's dtype.  out and residual_out are contiguous.
void rmsnorm(DType dtype, bool weight_f32, const void* x, int64_t x_stride,
             const void* residual, int64_t residual_stride, const void* weight, void* out,
             void* residual_out, int64_t rows, int64_t hidden, float eps);

// Rotate-half RoPE in place on q (T, Hq, D) and k (T, Hkv, D) at positions (T,), the
// first rot_dim dims of each head; cos_sin (max_pos, rot_dim) is float32 when cache_f32,
// else q's dtype.
void rope(DType dtype, bool cache_f32, void* q, int64_t q_stride_tok, int64_t q_stride_head,
          int64_t num_q_heads, void* k, int64_t k_stride_tok, int64_t k_stride_head,
          int64_t num_kv_heads, const int64_t* positions, const void* cos_sin,
          int64_t cos_sin_stride, int64_t num_tokens, int64_t rot_dim);

// out (T, I) contiguous = silu(x[:, :I]) * x[:, I:] for x (T, 2I) with row stride x_stride.
void silu_and_mul(DType dtype, const void* x, int64_t x_stride, void* out, int64_t rows,
                  int64_t inter_size);

// k_cache/v_cache[slot / block_size, slot % block_size] = key/value[t] for slots >= 0.
// Raw copies of elem_size-byte elements: any dtype.
struct KVStore {
  const void* key;
  int64_t key_stride_tok, key_stride_head;
  const void* value;
  int64_t value_stride_tok, value_stride_head;
  void* k_cache;
  int64_t kc_stride_block, kc_stride_slot, kc_stride_head;
  void* v_cache;
  int64_t vc_stride_block, vc_stride_slot, vc_stride_head;
  int64_t num_kv_heads, head_dim, v_head_dim, block_size, elem_size;
};
void store_kv(const KVStore& s, const int64_t* slot_mapping, int64_t num_tokens);

}  // namespace infbench_cpu
