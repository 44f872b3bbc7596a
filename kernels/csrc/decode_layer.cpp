// One decoder layer of a decode step in a single call: the `cpu` backend's answer to the
// per-layer fixed cost.  Through Python a SmolLM2 layer makes ~10 kernel calls, each with
// its own argument checks, tensor wrappers and module dispatch (~80 us per layer, 2.3 ms
// per 30-layer step, next to ~10 ms of weight streaming in bf16).  A DecodeLayer is built
// once per layer with the layer's weights and shapes (checked then) and `run` does
//   rmsnorm(+residual) -> qkv GEMV -> RoPE -> store K/V -> paged decode attention -> o GEMV
//   -> rmsnorm(+residual) -> gate_up GEMV -> SiLU-and-mul -> down GEMV
// with the same C++ kernels the per-op path calls, so the result is bit-identical to it.
// Only single-token decodes of a softmax-attention layer with a SwiGLU MLP and an
// unquantized KV cache go through here (at most 32 rows: the GEMV kernels' range); the
// model falls back to the per-op path for everything else.
#include <torch/extension.h>

#include "cpu_kernels.h"
#include "paged_view.h"
#include "quant_kernels.h"

namespace {

using infbench_cpu::DType;

DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return DType::Float32;
    case torch::kBFloat16: return DType::BFloat16;
    default: TORCH_CHECK(false, "decode_layer: float32 or bfloat16 only, got ", t.scalar_type());
  }
}

// A projection: a dense weight (N, K) in the activations' dtype, or int8 / int4 codes
// (kernels/quant_format.py); an optional bias.
struct Proj {
  torch::Tensor w, q, scales, mins, bias32;
  int64_t N = 0, K = 0, group = 0;
  int bits = 0;  // 0: dense
  bool act_int8 = false;  // quantized: int8 activations (quant_kernels.h)

  static Proj make(const py::tuple& spec, torch::ScalarType dtype, const char* name) {
    // spec: ("dense", w, bias) | ("quant", q, scales, mins_or_None, group_size, bias
    // [, act_int8])
    Proj p;
    const std::string kind = spec[0].cast<std::string>();
    py::object bias;
    if (kind == "dense") {
      p.w = spec[1].cast<torch::Tensor>().contiguous();
      TORCH_CHECK(p.w.dim() == 2 && p.w.scalar_type() == dtype, "decode_layer: ", name,
                  " weight must be (N, K) in the activation dtype");
      p.N = p.w.size(0);
      p.K = p.w.size(1);
      bias = spec[2];
    } else {
      TORCH_CHECK(kind == "quant", "decode_layer: unknown projection kind ", kind);
      p.q = spec[1].cast<torch::Tensor>().contiguous();
      p.scales = spec[2].cast<torch::Tensor>().contiguous();
      if (!spec[3].is_none()) p.mins = spec[3].cast<torch::Tensor>().contiguous();
      p.group = spec[4].cast<int64_t>();
      p.bits = p.q.scalar_type() == torch::kInt8 ? 8 : 4;
      TORCH_CHECK(p.scales.scalar_type() == torch::kFloat16, "decode_layer: fp16 scales");
      TORCH_CHECK(p.bits == 8 || (p.mins.defined() && p.q.scalar_type() == torch::kUInt8),
                  "decode_layer: ", name, ": int4 needs uint8 codes and mins");
      p.N = p.q.size(0);
      p.K = p.bits == 8 ? p.q.size(1) : p.q.size(1) * 2;
      TORCH_CHECK(p.group > 0 && p.K % p.group == 0, "decode_layer: bad group size");
      bias = spec[5];
      if (spec.size() > 6) p.act_int8 = spec[6].cast<bool>();
    }
    if (!bias.is_none()) p.bias32 = bias.cast<torch::Tensor>().to(torch::kFloat32).contiguous();
    return p;
  }

  // y (M, N) in x's dtype (x contiguous (M, K)).
  torch::Tensor operator()(const torch::Tensor& x) const {
    const int64_t M = x.size(0);
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    auto y = torch::empty({M, N}, x.options());
    const float* b = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
    if (bits == 0) {
      infbench_cpu::linear(x.data_ptr(), w.data_ptr(), b, y.data_ptr(), M, N, K, K, bf16, bf16);
    } else {
      infbench_cpu::QuantWeight qw{bits, q.data_ptr(),
                                   reinterpret_cast<const uint16_t*>(scales.data_ptr()),
                                   mins.defined() ? reinterpret_cast<const uint16_t*>(mins.data_ptr())
                                                  : nullptr,
                                   N, K, group, act_int8};
      auto xf = bf16 ? x.to(torch::kFloat32) : x;
      infbench_cpu::quant_linear(xf.data_ptr<float>(), qw, b, y.data_ptr(), M, bf16);
    }
    return y;
  }
};

class DecodeLayer {
 public:
  DecodeLayer(torch::Tensor in_norm, torch::Tensor post_norm, double eps, const py::tuple& qkv,
              const py::tuple& o, const py::tuple& gate_up, const py::tuple& down,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale,
              int64_t window, torch::Tensor rope_cache, bool owns_kv, torch::ScalarType dtype)
      : in_norm_(in_norm.contiguous()), post_norm_(post_norm.contiguous()),
        eps_(static_cast<float>(eps)), qkv_(Proj::make(qkv, dtype, "qkv_proj")),
        o_(Proj::make(o, dtype, "o_proj")), gate_up_(Proj::make(gate_up, dtype, "gate_up_proj")),
        down_(Proj::make(down, dtype, "down_proj")), heads_(num_heads), kv_heads_(num_kv_heads),
        head_dim_(head_dim), scale_(static_cast<float>(scale)), window_(window),
        owns_kv_(owns_kv), dtype_(dtype) {
    hidden_ = in_norm_.size(0);
    const int64_t qkv_rows = (heads_ + (owns_kv_ ? 2 * kv_heads_ : 0)) * head_dim_;
    TORCH_CHECK(qkv_.N == qkv_rows && qkv_.K == hidden_, "decode_layer: qkv_proj is ", qkv_.N,
                "x", qkv_.K, ", expected ", qkv_rows, "x", hidden_);
    TORCH_CHECK(o_.N == hidden_ && o_.K == heads_ * head_dim_, "decode_layer: o_proj shape");
    TORCH_CHECK(gate_up_.K == hidden_ && gate_up_.N % 2 == 0 && down_.N == hidden_ &&
                down_.K == gate_up_.N / 2, "decode_layer: MLP shapes");
    TORCH_CHECK(heads_ % kv_heads_ == 0, "decode_layer: heads not a multiple of KV heads");
    rope_f32_ = rope_cache.scalar_type() != dtype_ || dtype_ == torch::kFloat32;
    rope_ = rope_f32_ ? rope_cache.to(torch::kFloat32).contiguous() : rope_cache.contiguous();
    TORCH_CHECK(rope_.dim() == 2 && rope_.size(1) == head_dim_,
                "decode_layer: rope cache must be (max_pos, head_dim)");
  }

  // x (T, H) [+ residual (T, H)] for T single-token decodes -> (out, residual) as the
  // model's forward_fused returns them.  positions (T,) int64; slot_mapping (T,) int64;
  // tables (T, max_blocks) int32; context_lens (T,) int32.
  py::tuple run(const torch::Tensor& x_in, const c10::optional<torch::Tensor>& residual_in,
                const torch::Tensor& positions, const torch::Tensor& k_cache,
                const torch::Tensor& v_cache, const torch::Tensor& slot_mapping,
                const torch::Tensor& tables, const torch::Tensor& context_lens) {
    TORCH_CHECK(x_in.scalar_type() == dtype_ && x_in.dim() == 2 && x_in.size(1) == hidden_,
                "decode_layer: x must be (T, hidden) in the layer's dtype");
    const int64_t T = x_in.size(0);
    TORCH_CHECK(T <= 32, "decode_layer: at most 32 decodes per call");
    TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous() &&
                positions.size(0) == T, "decode_layer: positions must be (T,) int64");
    TORCH_CHECK(context_lens.scalar_type() == torch::kInt32 && context_lens.size(0) == T &&
                tables.scalar_type() == torch::kInt32 && tables.size(0) == T &&
                tables.stride(1) == 1, "decode_layer: tables (T, blocks) and lens (T,) int32");
    TORCH_CHECK(k_cache.scalar_type() == dtype_ && v_cache.scalar_type() == dtype_ &&
                k_cache.dim() == 4 && k_cache.size(2) == kv_heads_ && k_cache.size(3) == head_dim_ &&
                k_cache.stride(3) == 1 && v_cache.stride(3) == 1 &&
                v_cache.sizes() == k_cache.sizes(), "decode_layer: caches do not match the layer");
    const DType dt = dtype_of(x_in);
    auto x = x_in.contiguous();
    const int64_t* pos = positions.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
      TORCH_CHECK(pos[t] >= 0 && pos[t] < rope_.size(0), "decode_layer: position outside the cache");
    const int32_t* lens = context_lens.data_ptr<int32_t>();
    const int64_t capacity = tables.size(1) * k_cache.size(1);
    for (int64_t t = 0; t < T; ++t)
      TORCH_CHECK(lens[t] >= 1 && lens[t] <= capacity, "decode_layer: context length outside the table");

    // 1. input norm, fused with the residual add of the previous layer's output
    auto h = torch::empty_like(x);
    torch::Tensor residual;
    const bool norm_f32 = in_norm_.scalar_type() != x.scalar_type() || dt == DType::Float32;
    if (residual_in.has_value()) {
      auto r = residual_in->contiguous();
      residual = torch::empty_like(x);
      infbench_cpu::rmsnorm(dt, norm_f32, x.data_ptr(), hidden_, r.data_ptr(), hidden_,
                            in_norm_.data_ptr(), h.data_ptr(), residual.data_ptr(), T, hidden_, eps_);
    } else {
      residual = x;
      infbench_cpu::rmsnorm(dt, norm_f32, x.data_ptr(), hidden_, nullptr, 0, in_norm_.data_ptr(),
                            h.data_ptr(), nullptr, T, hidden_, eps_);
    }
    // 2. qkv projection; q, k, v are column slices of its rows
    auto qkv = qkv_(h);
    const int64_t row = qkv.size(1), q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    char* base = static_cast<char*>(qkv.data_ptr());
    const int64_t esz = qkv.element_size();
    void* q = base;
    void* k = base + q_size * esz;
    void* v = base + (q_size + kv_size) * esz;
    // 3. RoPE in place
    infbench_cpu::rope(dt, rope_f32_, q, row, head_dim_, heads_, owns_kv_ ? k : q, row, head_dim_,
                       owns_kv_ ? kv_heads_ : 0, pos, rope_.data_ptr(), rope_.stride(0), T,
                       head_dim_);
    // 4. this step's K/V into the cache
    if (owns_kv_) {
      TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous() &&
                  slot_mapping.size(0) == T, "decode_layer: slot_mapping must be (T,) int64");
      const int64_t* slots = slot_mapping.data_ptr<int64_t>();
      const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
      for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(slots[t] < num_slots, "decode_layer: slot past the cache");
      infbench_cpu::KVStore s{k, row, head_dim_, v, row, head_dim_,
                              k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                              v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                              kv_heads_, head_dim_, head_dim_, k_cache.size(1), esz};
      infbench_cpu::store_kv(s, slots, T);
    }
    // 5. paged decode attention
    const auto a = infbench_cpu::paged_view(k_cache, v_cache, tables, lens, heads_, scale_,
                                            window_, dt);
    auto attn = torch::empty({T, q_size}, x.options());
    infbench_cpu::paged_decode_attention(a, q, row, row, head_dim_, attn.data_ptr(), T, 1);
    // 6. output projection, 7. post-attention norm with the residual add
    auto o = o_(attn);
    auto h2 = torch::empty_like(x);
    auto residual2 = torch::empty_like(x);
    const bool post_f32 = post_norm_.scalar_type() != x.scalar_type() || dt == DType::Float32;
    infbench_cpu::rmsnorm(dt, post_f32, o.data_ptr(), hidden_, residual.data_ptr(), hidden_,
                          post_norm_.data_ptr(), h2.data_ptr(), residual2.data_ptr(), T, hidden_,
                          eps_);
    // 8. MLP
    auto gu = gate_up_(h2);
    const int64_t inter = gate_up_.N / 2;
    auto act = torch::empty({T, inter}, x.options());
    infbench_cpu::silu_and_mul(dt, gu.data_ptr(), gu.size(1), act.data_ptr(), T, inter);
    return py::make_tuple(down_(act), residual2);
  }

 private:
  torch::Tensor in_norm_, post_norm_, rope_;
  float eps_;
  Proj qkv_, o_, gate_up_, down_;
  int64_t heads_, kv_heads_, head_dim_;
  float scale_;
  int64_t window_;
  bool owns_kv_;
  torch::ScalarType dtype_;
  int64_t hidden_ = 0;
  bool rope_f32_ = false;
};

}  // namespace

void bind_decode_layer(pybind11::module_& m) {
  py::class_<DecodeLayer>(m, "DecodeLayer")
      .def(py::init<torch::Tensor, torch::Tensor, double, const py::tuple&, const py::tuple&,
                    const py::tuple&, const py::tuple&, int64_t, int64_t, int64_t, double,
                    int64_t, torch::Tensor, bool, torch::ScalarType>(),
           py::arg("in_norm"), py::arg("post_norm"), py::arg("eps"), py::arg("qkv"), py::arg("o"),
           py::arg("gate_up"), py::arg("down"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("scale"), py::arg("window"), py::arg("rope_cache"),
           py::arg("owns_kv"), py::arg("dtype"))
      .def("run", &DecodeLayer::run, py::arg("x"), py::arg("residual"), py::arg("positions"),
           py::arg("k_cache"), py::arg("v_cache"), py::arg("slot_mapping"), py::arg("tables"),
           py::arg("context_lens"));
}
