// Python bindings of the int8 KV-cache kernels (kv_quant.h): bind_kv_quant(m) is called
// from bindings.cpp's PYBIND11_MODULE.  Tensor checks live here; the kernels see raw
// pointers only.  The attention ops share their argument handling with the float cache's
// (paged_view.h); Int8Cache is what differs.
#include <torch/extension.h>

#include "kv_quant.h"
#include "paged_view.h"

namespace {

using infbench_cpu::DType;
using infbench_cpu::check_cpu;

DType activation_dtype(const torch::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return DType::Float32;
    case torch::kBFloat16: return DType::BFloat16;
    case torch::kFloat16: return DType::Float16;
    default: TORCH_CHECK(false, op, ": float32, bfloat16 or float16 activations only, got ",
                         t.scalar_type());
  }
}

// An int8 pool (num_blocks, block_size, Hkv, D) and its float32 scales (num_blocks,
// block_size, Hkv), as the kernels read them.
void check_pool(const char* op, const torch::Tensor& cache, const torch::Tensor& scales,
                const char* name) {
  check_cpu(cache, op, name);
  check_cpu(scales, op, name);
  TORCH_CHECK(cache.dim() == 4 && cache.scalar_type() == torch::kInt8 && cache.stride(3) == 1,
              op, ": ", name, " must be an int8 (num_blocks, block_size, Hkv, D) cache with "
              "contiguous rows");
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == torch::kFloat32 &&
              scales.size(0) == cache.size(0) && scales.size(1) == cache.size(1) &&
              scales.size(2) == cache.size(2),
              op, ": the scales of ", name, " must be float32 (num_blocks, block_size, Hkv)");
}

// The int8 cache of the attention ops (paged_view.h): int8 pools and their float32
// scales, q in any activation dtype.
struct Int8Cache {
  const torch::Tensor& k_cache;
  const torch::Tensor& v_cache;
  const torch::Tensor& k_scales;
  const torch::Tensor& v_scales;
  static constexpr auto decode = &infbench_cpu::paged_decode_attention_int8;
  static constexpr auto prefill = &infbench_cpu::prefill_attention_int8;

  infbench_cpu::PagedAttentionInt8 args(const char* op, const torch::Tensor& q,
                                        const torch::Tensor& block_tables,
                                        const torch::Tensor& context_lens, int64_t num_q_heads,
                                        double scale, const c10::optional<int64_t>& window) const {
    check_pool(op, k_cache, k_scales, "k_cache");
    check_pool(op, v_cache, v_scales, "v_cache");
    check_cpu(block_tables, op, "block_tables");
    const int32_t* lens = infbench_cpu::check_paged(op, q, k_cache, v_cache, block_tables,
                                                    context_lens, num_q_heads, window);
    infbench_cpu::PagedAttentionInt8 p{};
    p.a = infbench_cpu::paged_view(k_cache, v_cache, block_tables, lens, num_q_heads, scale,
                                   window.value_or(0), activation_dtype(q, op));
    p.k_scales = k_scales.data_ptr<float>();
    p.ks_stride_block = k_scales.stride(0);
    p.ks_stride_slot = k_scales.stride(1);
    p.ks_stride_head = k_scales.stride(2);
    p.v_scales = v_scales.data_ptr<float>();
    p.vs_stride_block = v_scales.stride(0);
    p.vs_stride_slot = v_scales.stride(1);
    p.vs_stride_head = v_scales.stride(2);
    return p;
  }
};

// q (B, Hq, D) or (B, Q, Hq, D) over the int8 paged cache -> q's shape with Dv.
torch::Tensor paged_decode_attention_int8(const torch::Tensor& q, const torch::Tensor& k_cache,
                                          const torch::Tensor& v_cache,
                                          const torch::Tensor& k_scales,
                                          const torch::Tensor& v_scales,
                                          const torch::Tensor& block_tables,
                                          const torch::Tensor& context_lens, double scale,
                                          c10::optional<int64_t> window) {
  return infbench_cpu::decode_attention_op("paged_decode_attention_int8",
                                           Int8Cache{k_cache, v_cache, k_scales, v_scales}, q,
                                           block_tables, context_lens, scale, window);
}

// Causal attention of the new tokens q (T, Hq, D) of B sequences over the int8 cache.
torch::Tensor prefill_attention_int8(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& k_scales,
                                     const torch::Tensor& v_scales,
                                     const torch::Tensor& cu_seqlens_q,
                                     const torch::Tensor& context_lens,
                                     const torch::Tensor& block_tables, double scale,
                                     c10::optional<int64_t> window) {
  return infbench_cpu::prefill_attention_op("prefill_attention_int8",
                                            Int8Cache{k_cache, v_cache, k_scales, v_scales}, q,
                                            cu_seqlens_q, context_lens, block_tables, scale,
                                            window);
}

// Quantize key/value (T, Hkv, D|Dv) into the int8 caches at slot_mapping (slots < 0 skipped).
void store_kv_int8(const torch::Tensor& key, const torch::Tensor& value,
                   const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                   const torch::Tensor& slot_mapping, const torch::Tensor& k_scales,
                   const torch::Tensor& v_scales) {
  const char* op = "store_kv_int8";
  check_cpu(key, op, "key");
  check_cpu(value, op, "value");
  check_cpu(slot_mapping, op, "slot_mapping");
  check_pool(op, k_cache, k_scales, "k_cache");
  check_pool(op, v_cache, v_scales, "v_cache");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3,
              op, ": expected key (T, Hkv, D) and value (T, Hkv, Dv)");
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1);
  TORCH_CHECK(value.size(0) == num_tokens && value.size(1) == num_kv_heads &&
              k_cache.size(2) == num_kv_heads && k_cache.size(3) == key.size(2) &&
              v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == k_cache.size(1) &&
              v_cache.size(2) == num_kv_heads && v_cache.size(3) == value.size(2),
              op, ": key, value and cache shapes disagree");
  TORCH_CHECK(key.scalar_type() == value.scalar_type(), op, ": key and value dtypes differ");
  const DType dtype = activation_dtype(key, op);
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == num_tokens,
              op, ": slot_mapping must be (T,)");
  if (num_tokens == 0) return;
  auto kc = key.stride(2) == 1 ? key : key.contiguous();
  auto vc = value.stride(2) == 1 ? value : value.contiguous();
  auto slots = slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous()
                   ? slot_mapping : slot_mapping.to(torch::kInt64).contiguous();
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < num_tokens; ++t)
    TORCH_CHECK(s[t] < num_slots, op, ": slot ", s[t], " is past the cache's ", num_slots, " slots");
  infbench_cpu::KVStoreInt8 p{
      {kc.data_ptr(), kc.stride(0), kc.stride(1), vc.data_ptr(), vc.stride(0), vc.stride(1),
       k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
       v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
       num_kv_heads, key.size(2), value.size(2), k_cache.size(1), 1},
      dtype,
      k_scales.data_ptr<float>(), k_scales.stride(0), k_scales.stride(1), k_scales.stride(2),
      v_scales.data_ptr<float>(), v_scales.stride(0), v_scales.stride(1), v_scales.stride(2)};
  infbench_cpu::store_kv_int8(p, s, num_tokens);
}

}  // namespace

void bind_kv_quant(pybind11::module_& m) {
  m.def("paged_decode_attention_int8", &paged_decode_attention_int8,
        "paged decode attention over an int8 KV cache with per-token, per-head scales",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("k_scales"),
        py::arg("v_scales"), py::arg("block_tables"), py::arg("context_lens"), py::arg("scale"),
        py::arg("window") = py::none());
  m.def("prefill_attention_int8", &prefill_attention_int8,
        "varlen causal prefill attention over an int8 KV cache",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("k_scales"),
        py::arg("v_scales"), py::arg("cu_seqlens_q"), py::arg("context_lens"),
        py::arg("block_tables"), py::arg("scale"), py::arg("window") = py::none());
  m.def("store_kv_int8", &store_kv_int8,
        "quantize new keys and values into an int8 paged KV cache (per-token, per-head scales)",
        py::arg("key"), py::arg("value"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("slot_mapping"), py::arg("k_scales"), py::arg("v_scales"));
}
