// Python bindings of the CPU kernels (kernels/cpu_ops.py builds and loads this module).
// Tensor checks live here; the kernels in the other files see raw pointers only.
#include <torch/extension.h>

#include "cpu_kernels.h"
#include "paged_view.h"

void bind_quant(pybind11::module_& m);  // bindings_quant.cpp
void bind_decode_layer(pybind11::module_& m);  // decode_layer.cpp
void bind_kv_quant(pybind11::module_& m);  // bindings_kvq.cpp

namespace {

void check_cpu(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
}

// x (M, K) @ w (N, K)^T [+ bias] in x's dtype (float32 or bfloat16); out_float32 makes
// the output float32 whatever the input (logits).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w,
                     const c10::optional<torch::Tensor>& bias, bool out_float32) {
  check_cpu(x, "x");
  check_cpu(w, "w");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "linear: expected x (M, K) and w (N, K)");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear: x and w dtypes differ");
  auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
              "linear: float32 or bfloat16 only");
  auto xc = x.stride(1) == 1 ? x : x.contiguous();
  auto wc = w.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
  const bool y_bf16 = dtype == torch::kBFloat16 && !out_float32;
  auto y = torch::empty({M, N}, x.options().dtype(y_bf16 ? torch::kBFloat16 : torch::kFloat32));
  torch::Tensor b32;
  if (bias.has_value()) b32 = bias->to(torch::kFloat32).contiguous();
  infbench_cpu::linear(xc.data_ptr(), wc.data_ptr(), bias.has_value() ? b32.data_ptr<float>() : nullptr,
                       y.data_ptr(), M, N, K, xc.stride(0), dtype == torch::kBFloat16, y_bf16);
  return y;
}


// ---- per-layer ops: checks here, raw pointers in the kernels -------------------------

using infbench_cpu::DType;

DType dtype_of(const torch::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return DType::Float32;
    case torch::kBFloat16: return DType::BFloat16;
    case torch::kFloat16: return DType::Float16;
    default: TORCH_CHECK(false, op, ": float32, bfloat16 or float16 only, got ", t.scalar_type());
  }
}

// The float cache of the attention ops (paged_view.h): k_cache and v_cache in q's dtype.
struct FloatCache {
  const torch::Tensor& k_cache;
  const torch::Tensor& v_cache;
  static constexpr auto decode = &infbench_cpu::paged_decode_attention;
  static constexpr auto prefill = &infbench_cpu::prefill_attention;

  infbench_cpu::PagedAttention args(const char* op, const torch::Tensor& q,
                                    const torch::Tensor& block_tables,
                                    const torch::Tensor& context_lens, int64_t num_q_heads,
                                    double scale, const c10::optional<int64_t>& window) const {
    TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
                op, ": q, k_cache and v_cache must share a dtype");
    const int32_t* lens = infbench_cpu::check_paged(op, q, k_cache, v_cache, block_tables,
                                                    context_lens, num_q_heads, window);
    return infbench_cpu::paged_view(k_cache, v_cache, block_tables, lens, num_q_heads, scale,
                                    window.value_or(0), dtype_of(q, op));
  }
};

// q (B, Hq, D) or (B, Q, Hq, D) over the paged cache -> q's shape with Dv, in q's dtype.
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                     const torch::Tensor& context_lens, double scale,
                                     c10::optional<int64_t> window) {
  return infbench_cpu::decode_attention_op("paged_decode_attention", FloatCache{k_cache, v_cache},
                                           q, block_tables, context_lens, scale, window);
}

// Causal attention of the new tokens q (T, Hq, D) of B sequences -> (T, Hq, Dv).
torch::Tensor prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                const torch::Tensor& v_cache, const torch::Tensor& cu_seqlens_q,
                                const torch::Tensor& context_lens, const torch::Tensor& block_tables,
                                double scale, c10::optional<int64_t> window) {
  return infbench_cpu::prefill_attention_op("prefill_attention", FloatCache{k_cache, v_cache}, q,
                                            cu_seqlens_q, context_lens, block_tables, scale,
                                            window);
}

// HF LlamaRMSNorm of x (..., H) [+ residual]: out, or (out, x + residual).
py::object rmsnorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                   const c10::optional<torch::Tensor>& residual) {
  const char* op = "rmsnorm";
  check_cpu(x, "x");
  check_cpu(weight, "weight");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              op, ": expected x (..., H) and weight (H,)");
  const DType dtype = dtype_of(x, op);
  const int64_t hidden = x.size(-1);
  // 2-D keeps its row stride (a view of a wider output); other ranks are flattened.
  auto x2 = x.dim() == 2 && x.stride(1) == 1 ? x : x.reshape({-1, hidden}).contiguous();
  const int64_t rows = x2.size(0);
  auto w = weight.scalar_type() == x.scalar_type() || weight.scalar_type() == torch::kFloat32
               ? weight.contiguous() : weight.to(torch::kFloat32).contiguous();
  auto out = torch::empty(x.sizes(), x.options());
  if (!residual.has_value()) {
    infbench_cpu::rmsnorm(dtype, w.scalar_type() != x.scalar_type() || dtype == DType::Float32,
                          x2.data_ptr(), x2.stride(0), nullptr, 0, w.data_ptr(), out.data_ptr(),
                          nullptr, rows, hidden, static_cast<float>(eps));
    return py::cast(out);
  }
  check_cpu(*residual, "residual");
  TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
              op, ": residual must match x in shape and dtype");
  auto r2 = residual->dim() == 2 && residual->stride(1) == 1
                ? *residual : residual->reshape({-1, hidden}).contiguous();
  auto summed = torch::empty(x.sizes(), x.options());
  infbench_cpu::rmsnorm(dtype, w.scalar_type() != x.scalar_type() || dtype == DType::Float32,
                        x2.data_ptr(), x2.stride(0), r2.data_ptr(), r2.stride(0), w.data_ptr(),
                        out.data_ptr(), summed.data_ptr(), rows, hidden, static_cast<float>(eps));
  return py::make_tuple(out, summed);
}

// Rotate q (T, Hq, D) and k (T, Hkv, D) in place at positions (T,); the first rot_dim dims.
void rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& positions,
          const torch::Tensor& cos_sin_cache, c10::optional<int64_t> rotary_dim) {
  const char* op = "rope";
  check_cpu(q, "q");
  check_cpu(k, "k");
  check_cpu(positions, "positions");
  check_cpu(cos_sin_cache, "cos_sin_cache");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              op, ": expected q (T, Hq, D) and k (T, Hkv, D)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), op, ": q and k dtypes differ");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, op, ": head dims of q and k must be contiguous");
  const DType dtype = dtype_of(q, op);
  const int64_t rot_dim = rotary_dim.value_or(q.size(2));
  TORCH_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= q.size(2), op, ": bad rotary_dim ", rot_dim);
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rot_dim,
              op, ": cos_sin_cache must be (max_pos, rotary_dim)");
  const int64_t num_tokens = q.size(0);
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == num_tokens, op, ": positions must be (T,)");
  if (num_tokens == 0) return;
  auto pos = positions.scalar_type() == torch::kInt64 && positions.is_contiguous()
                 ? positions : positions.to(torch::kInt64).contiguous();
  const bool cache_f32 = cos_sin_cache.scalar_type() != q.scalar_type();
  auto cache = cos_sin_cache;
  if (cache_f32 && cache.scalar_type() != torch::kFloat32) cache = cache.to(torch::kFloat32);
  if (cache.stride(1) != 1) cache = cache.contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t)
    TORCH_CHECK(p[t] >= 0 && p[t] < cache.size(0), op, ": position ", p[t], " is outside the cache");
  infbench_cpu::rope(dtype, cache_f32 || dtype == DType::Float32, q.data_ptr(), q.stride(0),
                     q.stride(1), q.size(1), k.data_ptr(), k.stride(0), k.stride(1), k.size(1), p,
                     cache.data_ptr(), cache.stride(0), num_tokens, rot_dim);
}

// silu(x[:, :I]) * x[:, I:] for x (T, 2I) -> (T, I).
torch::Tensor silu_and_mul(const torch::Tensor& x) {
  const char* op = "silu_and_mul";
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x must be (..., 2I)");
  const DType dtype = dtype_of(x, op);
  const int64_t inter = x.size(-1) / 2;
  auto x2 = x.dim() == 2 && x.stride(1) == 1 ? x : x.reshape({-1, 2 * inter}).contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = inter;
  auto out = torch::empty(sizes, x.options());
  infbench_cpu::silu_and_mul(dtype, x2.data_ptr(), x2.stride(0), out.data_ptr(), x2.size(0), inter);
  return out;
}

// k_cache/v_cache[slot // block_size, slot % block_size] = key/value[t], slots < 0 skipped.
void store_kv(const torch::Tensor& key, const torch::Tensor& value, const torch::Tensor& k_cache,
              const torch::Tensor& v_cache, const torch::Tensor& slot_mapping) {
  const char* op = "store_kv";
  for (auto* t : {&key, &value, &k_cache, &v_cache, &slot_mapping}) check_cpu(*t, op);
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4,
              op, ": expected key/value (T, Hkv, D) and caches (blocks, block_size, Hkv, D)");
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1);
  TORCH_CHECK(value.size(0) == num_tokens && value.size(1) == num_kv_heads &&
              k_cache.size(2) == num_kv_heads && k_cache.size(3) == key.size(2) &&
              v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == k_cache.size(1) &&
              v_cache.size(2) == num_kv_heads && v_cache.size(3) == value.size(2),
              op, ": key, value and cache shapes disagree");
  const auto dtype = k_cache.scalar_type();
  TORCH_CHECK(key.scalar_type() == dtype && value.scalar_type() == dtype &&
              v_cache.scalar_type() == dtype, op, ": key, value and caches must share a dtype");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, op, ": cache rows must be contiguous");
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
  infbench_cpu::KVStore a{kc.data_ptr(), kc.stride(0), kc.stride(1),
                          vc.data_ptr(), vc.stride(0), vc.stride(1),
                          k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                          v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                          num_kv_heads, key.size(2), value.size(2), k_cache.size(1),
                          static_cast<int64_t>(k_cache.element_size())};
  infbench_cpu::store_kv(a, s, num_tokens);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "infbench CPU kernels (built on first use with -march=native)";
  bind_quant(m);
  bind_decode_layer(m);
  bind_kv_quant(m);
  m.def("linear", &linear, "x @ w.T [+ bias], fp32 accumulation", py::arg("x"), py::arg("w"),
        py::arg("bias") = py::none(), py::arg("out_float32") = false);
  m.def("paged_decode_attention", &paged_decode_attention,
        "attention of the last Q tokens of each sequence over its paged KV cache, in place",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("window") = py::none());
  m.def("prefill_attention", &prefill_attention,
        "varlen causal attention of new tokens over the paged KV cache, in place",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("cu_seqlens_q"),
        py::arg("context_lens"), py::arg("block_tables"), py::arg("scale"),
        py::arg("window") = py::none());
  m.def("rmsnorm", &rmsnorm, "HF LlamaRMSNorm with an optional fused residual add",
        py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("residual") = py::none());
  m.def("rope", &rope, "rotate-half RoPE in place on q and k", py::arg("q"), py::arg("k"),
        py::arg("positions"), py::arg("cos_sin_cache"), py::arg("rotary_dim") = py::none());
  m.def("silu_and_mul", &silu_and_mul, "silu(x[:, :I]) * x[:, I:]", py::arg("x"));
  m.def("store_kv", &store_kv, "write new keys and values into the paged KV cache",
        py::arg("key"), py::arg("value"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("slot_mapping"));
}
