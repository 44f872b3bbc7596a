"""LLM.int8(): vector-wise int8 with outlier decomposition (Dettmers et al. 2022).

A few input features of a projection (hidden-state dimensions) carry activations far
larger than the rest; quantizing them to int8 together with the others wrecks the
per-row activation scale.  LLM.int8() splits the product by input feature:

    y = (x[:, ~O] W[:, ~O]^T  in int8)  +  (x[:, O] W[:, O]^T  in the model dtype)

where O is the set of outlier features.  The int8 part is vector-wise: each output row of
W gets one scale (absmax / 127 over its non-outlier columns) and each activation row one
scale (absmax / 127 over its non-outlier features); the int8 x int8 products accumulate
in int32 and are scaled back by (row scale x column scale).

Static outliers: the paper picks O at run time, per batch, from |x| >= 6.  The engine
needs static shapes, so here O is chosen once at load time: the input features whose
largest |x| over the calibration tokens (`calibration.for_each_layer`, float model) passes
`quant.outlier_threshold`; O is then fixed for every batch.

What runs where (`LLMInt8Linear.forward`):
- the `torch` backend (`reference()`; also the model's plain forward, which `infbench eval`
  measures): the full method above, activations quantized per row, `torch._int_mm`
  (int8 x int8 -> int32) on the CPU and on CUDA where its shape rules allow, an exact
  float64 product of the int8 values otherwise;
- the `cpu` backend (`weight_only()`): the weight-only variant, activations stay float:
  decode rows through the C++ int8 GEMV (`kernels/cpu_quant_linear.py`) plus the outlier
  columns, prefill through one GEMM on the dequantized matrix.  On SmolLM2 this variant
  is the more accurate of the two (docs/awq-llm-int8.md).

Storage: the int8 matrix keeps all K columns, the outlier columns zero (so the C++ GEMV
reads an ordinary per-row int8 weight and x needs no gather), plus W[:, O] in the model
dtype and the int64 indices of O: `stored_bytes` = N K + 2 N (what `QuantConfig`
prices for int8) + N |O| dtype bytes + 8 |O|.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import QuantConfig
from infbench.model.calibration import InputStats, for_each_layer
from infbench.model.transformer import Transformer
from kernels.cpu_quant_linear import MAX_ROWS as CPU_MAX_ROWS
from kernels.cpu_quant_linear import cpu_dequantize, cpu_quant_linear
from kernels.quant_format import Int8Weight, quantize_int8


class LLMInt8Linear(nn.Module):
    """y = x W^T [+ bias] as int8 (per-row weight scales, per-row activation scales) on the
    non-outlier input features plus the outlier features in the model dtype."""

    qweight: torch.Tensor  # (N, K) int8, outlier columns 0
    scales: torch.Tensor  # (N, 1) float16
    outlier_idx: torch.Tensor  # (|O|,) int64, sorted
    outlier_weight: torch.Tensor  # (N, |O|) model dtype

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 outliers: torch.Tensor) -> None:
        """weight (N, K) float; outliers (K,) bool: the input features kept in float."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        idx = outliers.nonzero().flatten().to(torch.long)  # (|O|,)
        inliers = weight.detach().float().clone()
        inliers[:, idx] = 0.0  # the int8 part never sees the outlier columns
        fmt = quantize_int8(inliers)  # one scale per output row
        self.register_buffer("qweight", fmt.q)
        self.register_buffer("scales", fmt.scales)
        self.register_buffer("outlier_idx", idx)
        self.register_buffer("outlier_weight", weight.detach()[:, idx].contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(),
                                                           requires_grad=False)
        self.backend = "torch"

    @property
    def num_outliers(self) -> int:
        return int(self.outlier_idx.numel())

    def int8_weight(self) -> Int8Weight:
        return Int8Weight(self.qweight, self.scales, self.in_features)

    @property
    def stored_bytes(self) -> int:
        """int8 weight + fp16 row scales + outlier columns + their indices (bias excluded)."""
        return (self.int8_weight().nbytes
                + self.outlier_weight.numel() * self.outlier_weight.element_size()
                + self.outlier_idx.numel() * self.outlier_idx.element_size())

    def set_backend(self, backend: str) -> None:
        self.backend = backend

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32: the weight the product multiplies by (activation rounding aside)."""
        w = self.int8_weight().dequantize()
        w[:, self.outlier_idx] = self.outlier_weight.float()
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.backend == "cpu" and x.device.type == "cpu" and x.dim() == 2
                and x.dtype in (torch.float32, torch.bfloat16)):
            return self.weight_only(x)
        return self.reference(x)

    def weight_only(self, x: torch.Tensor) -> torch.Tensor:
        """The `cpu` backend: activations stay float.  Decode rows go through the C++ int8
        GEMV (its outlier columns are 0) plus the outlier columns; more rows (prefill)
        rebuild the float matrix once, outlier columns written in, for one BLAS GEMM."""
        if x.shape[0] <= CPU_MAX_ROWS:
            y = cpu_quant_linear(x, self.int8_weight(), self.bias)
            if self.num_outliers:
                y = y + F.linear(x[:, self.outlier_idx], self.outlier_weight.to(x.dtype))
            return y
        w = cpu_dequantize(self.int8_weight(), x.dtype)  # (N, K)
        w[:, self.outlier_idx] = self.outlier_weight.to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The full LLM.int8() product: int8 activations x int8 weights -> int32, rescaled,
        plus the outlier features in x's dtype."""
        x2 = x.reshape(-1, self.in_features)  # (T, K)
        inl = x2.float()
        if self.num_outliers:
            inl = inl.index_fill(1, self.outlier_idx, 0.0)
        row_scale = inl.abs().amax(1, keepdim=True).clamp(min=1e-10) / 127.0  # (T, 1)
        qx = torch.round(inl / row_scale).clamp(-127, 127).to(torch.int8)  # (T, K)
        acc = int8_matmul(qx, self.qweight)  # (T, N) int32
        y = acc.float() * row_scale * self.scales.float().t()  # (T, N)
        if self.num_outliers:
            y = y + F.linear(x2[:, self.outlier_idx].float(), self.outlier_weight.float())
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8, outliers={self.num_outliers}")


def int8_matmul(qx: torch.Tensor, qw: torch.Tensor) -> torch.Tensor:
    """qx (T, K) int8 @ qw (N, K)^T int8 -> (T, N) int32, exactly."""
    if qx.device.type == "cpu" or (qx.shape[0] > 16 and qx.shape[1] % 8 == 0
                                   and qw.shape[0] % 8 == 0):
        return torch._int_mm(qx, qw.t())
    # float64 holds every int32 sum exactly (|sum| <= K * 127^2 < 2^53)
    return (qx.double() @ qw.double().t()).to(torch.int32)


@dataclass
class Int8Result:
    """Outlier features chosen per projection kind (one count per layer)."""

    threshold: float
    outliers: dict[str, list[int]] = field(default_factory=dict)
    num_layers: int = 0
    seconds: float = 0.0  # the calibration pass and the quantization

    @property
    def total(self) -> int:
        return sum(sum(v) for v in self.outliers.values())

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {sum(v)}" for k, v in self.outliers.items())
        return f"outlier features at |x| > {self.threshold:g}: {self.total} ({kinds})"


def llm_int8_quantize(model: Transformer, quant: QuantConfig, ids: list[int]) -> Int8Result:
    """Replace every projection inside the decoder layers of `model` by an LLMInt8Linear
    whose outlier features are those passing `quant.outlier_threshold` on the calibration
    token `ids`."""
    result = Int8Result(quant.outlier_threshold)
    start = time.perf_counter()

    def on_layer(_index: int, layer: nn.Module, stats: dict[str, InputStats]) -> None:
        for prefix, parent in list(layer.named_modules()):
            for name, child in list(parent.named_children()):
                if not isinstance(child, nn.Linear):
                    continue
                key = f"{prefix}.{name}" if prefix else name
                outliers = stats[key].abs_max > quant.outlier_threshold  # (K,)
                module = LLMInt8Linear(child.weight, child.bias, outliers)
                setattr(parent, name, module)
                result.outliers.setdefault(name, []).append(module.num_outliers)
        result.num_layers += 1

    for_each_layer(model, ids, on_layer)
    result.seconds = time.perf_counter() - start
    return result
