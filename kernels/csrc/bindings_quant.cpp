// Python bindings of the weight-only int8 / int4 kernels (quant_kernels.h): tensor checks
// here, raw pointers in linear.cpp.  bind_quant is called from bindings.cpp's module.
#include <torch/extension.h>

#include "quant_kernels.h"

namespace {

infbench_cpu::QuantWeight quant_weight(const torch::Tensor& q, const torch::Tensor& scales,
                                       const c10::optional<torch::Tensor>& mins,
                                       int64_t group_size) {
  TORCH_CHECK(q.device().is_cpu() && scales.device().is_cpu(), "quant: CPU tensors only");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous(), "quant: q must be a contiguous (N, K) matrix");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat16 && scales.is_contiguous(),
              "quant: scales must be contiguous float16");
  infbench_cpu::QuantWeight w{};
  w.N = q.size(0);
  w.group = group_size;
  if (q.scalar_type() == torch::kInt8) {
    TORCH_CHECK(!mins.has_value(), "quant: int8 weights have no mins");
    w.bits = 8;
    w.K = q.size(1);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kUInt8, "quant: q must be int8 or packed uint8 (int4)");
    TORCH_CHECK(mins.has_value() && mins->scalar_type() == torch::kFloat16 &&
                    mins->is_contiguous() && mins->sizes() == scales.sizes(),
                "quant: int4 needs float16 mins shaped like the scales");
    w.bits = 4;
    w.K = q.size(1) * 2;
    w.mins = reinterpret_cast<const uint16_t*>(mins->data_ptr());
    TORCH_CHECK(group_size % 32 == 0, "quant: int4 group_size must be a multiple of 32");
  }
  TORCH_CHECK(group_size > 0 && w.K % group_size == 0, "quant: group_size ", group_size,
              " does not divide K = ", w.K);
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == w.N && scales.size(1) == w.K / group_size,
              "quant: scales must be (N, K / group_size)");
  w.q = q.data_ptr();
  w.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  return w;
}

// x (M, K) float32 or bfloat16 @ dequant(w)^T [+ bias] -> (M, N) in x's dtype (float32 if
// out_float32).  M <= 32.
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& q,
                           const torch::Tensor& scales, const c10::optional<torch::Tensor>& mins,
                           int64_t group_size, const c10::optional<torch::Tensor>& bias,
                           bool out_float32, bool act_int8) {
  auto w = quant_weight(q, scales, mins, group_size);
  w.act_int8 = act_int8;
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(1) == w.K,
              "quant_linear: expected x (M, K) on the CPU");
  TORCH_CHECK(x.size(0) <= 32, "quant_linear: at most 32 rows (dequantize for more)");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "quant_linear: x must be float32 or bfloat16");
  auto xf = x.to(torch::kFloat32).contiguous();
  const bool y_bf16 = x.scalar_type() == torch::kBFloat16 && !out_float32;
  auto y = torch::empty({x.size(0), w.N},
                        x.options().dtype(y_bf16 ? torch::kBFloat16 : torch::kFloat32));
  torch::Tensor b32;
  if (bias.has_value()) b32 = bias->to(torch::kFloat32).contiguous();
  infbench_cpu::quant_linear(xf.data_ptr<float>(), w, bias.has_value() ? b32.data_ptr<float>() : nullptr,
                             y.data_ptr(), x.size(0), y_bf16);
  return y;
}

// dequant(w) (N, K) in dtype (float32 or bfloat16).
torch::Tensor quant_dequantize(const torch::Tensor& q, const torch::Tensor& scales,
                               const c10::optional<torch::Tensor>& mins, int64_t group_size,
                               torch::ScalarType dtype) {
  auto w = quant_weight(q, scales, mins, group_size);
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
              "quant_dequantize: float32 or bfloat16 output");
  auto out = torch::empty({w.N, w.K}, q.options().dtype(dtype));
  infbench_cpu::quant_dequantize(w, out.data_ptr(), dtype == torch::kBFloat16);
  return out;
}

}  // namespace

void bind_quant(pybind11::module_& m) {
  m.def("quant_linear", &quant_linear, "x @ dequant(w).T [+ bias] for int8 / int4 weights",
        py::arg("x"), py::arg("q"), py::arg("scales"), py::arg("mins"), py::arg("group_size"),
        py::arg("bias") = py::none(), py::arg("out_float32") = false,
        py::arg("act_int8") = false);
  m.def("quant_gemv_q8act_supported", &infbench_cpu::quant_gemv_q8act_supported,
        "whether this build has the int8-activation VNNI GEMV (AVX512-VNNI)");
  m.def("quant_dequantize", &quant_dequantize, "dequant(w) as a float matrix", py::arg("q"),
        py::arg("scales"), py::arg("mins"), py::arg("group_size"), py::arg("dtype"));
}
