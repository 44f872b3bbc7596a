// Python bindings of the CPU kernels (kernels/cpu_ops.py builds and loads this module).
// Tensor checks live here; the kernels in the other files see raw pointers only.
#include <torch/extension.h>

#include "cpu_kernels.h"

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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "infbench CPU kernels (built on first use with -march=native)";
  m.def("linear", &linear, "x @ w.T [+ bias], fp32 accumulation", py::arg("x"), py::arg("w"),
        py::arg("bias") = py::none(), py::arg("out_float32") = false);
}
