"""Projections stored in the low-precision float formats of current checkpoints: FP8 (E4M3
with tensor / channel / 128x128 block scales), MXFP4 and NVFP4 (`kernels/fp_format.py`).

`FloatCodeLinear` holds one matrix's codes and scales as buffers, nothing in float, and
multiplies them as stored: on CUDA the Triton kernel that decodes each weight tile in
registers (`kernels/fp_matmul.py`), on a CPU the torch path that decodes a slice of rows
at a time (`kernels/cpu_fp_linear.py`); both give x @ dequantize(W)^T.  `quantize_model`
makes them from a float model's projections (`quant.weights: fp8 | mxfp4 | nvfp4`, a fused
q/k/v or gate/up matrix quantized as one matrix, as `predict` prices it); the safetensors
loader makes them from a checkpoint's own codes (`model/fp_checkpoint.py`), where a fused
projection whose parts carry their own scales is a `ShardedLinear` of one per part.

`quant.activations` fp8 / fp4 (W8A8 / W4A4) reproduce the numerics only: each activation
row is rounded to E4M3 with its own scale, or to E2M1 in the weights' block format, and
the product then runs on the rounded values in float32.  No kernel here multiplies fp8 or
fp4 operands on tensor cores, so these modes are not faster than weight-only ones.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu_fp_linear import cpu_fp_linear
from kernels.fp_format import (
    FloatQuantWeight,
    Fp8Weight,
    Mxfp4Weight,
    Nvfp4Weight,
    fake_quantize_fp4_rows,
    fake_quantize_fp8_rows,
    quantize_float_format,
)

FLOAT_ACTIVATIONS = ("float", "fp8", "fp4")


class FloatCodeLinear(nn.Module):
    """y = x @ dequantize(W)^T [+ bias] with W stored as fp8, mxfp4 or nvfp4 codes."""

    codes: torch.Tensor  # fp8: (N, K) float8_e4m3fn; fp4: (N, K // 2) uint8 packed pairs
    scales: torch.Tensor  # fp8: float32 blocks; mxfp4: (N, K // 32) uint8; nvfp4: e4m3
    global_scale: torch.Tensor | None  # nvfp4: () float32

    def __init__(self, weight: FloatQuantWeight, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.block_n = self.block_k = 0
        if isinstance(weight, Fp8Weight):
            self.kind = "fp8"
            self.block_n, self.block_k = weight.block_n, weight.block_k
            self.register_buffer("codes", weight.codes)
        else:
            self.kind = "mxfp4" if isinstance(weight, Mxfp4Weight) else "nvfp4"
            self.register_buffer("codes", weight.packed)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("global_scale", weight.global_scale
                             if isinstance(weight, Nvfp4Weight) else None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype),
                                                           requires_grad=False)
        self.backend = "torch"
        self.activations = "float"

    # ---- format ----------------------------------------------------------------------
    def weight_format(self) -> FloatQuantWeight:
        if self.kind == "fp8":
            return Fp8Weight(self.codes, self.scales, self.block_n, self.block_k)
        if self.kind == "mxfp4":
            return Mxfp4Weight(self.codes, self.scales)
        assert self.global_scale is not None
        return Nvfp4Weight(self.codes, self.scales, self.global_scale)

    @property
    def format_name(self) -> str:
        """The stored format as `core/formats.float_code_format` names it: fp8/tensor,
        fp8/channel, fp8/block, mxfp4, nvfp4."""
        fmt = self.weight_format()
        return f"fp8/{fmt.granularity}" if isinstance(fmt, Fp8Weight) else self.kind

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32: what the product multiplies by."""
        return self.weight_format().dequantize()

    @property
    def stored_bytes(self) -> int:
        """Bytes of the codes and scales (bias not included)."""
        return self.weight_format().nbytes

    def set_backend(self, backend: str) -> None:
        self.backend = backend

    def set_activations(self, activations: str) -> None:
        """`quant.activations`: float | fp8 (fp8 weights) | fp4 (mxfp4 / nvfp4 weights)."""
        allowed = {"fp8": ("fp8",), "mxfp4": ("fp4",), "nvfp4": ("fp4",)}[self.kind]
        if activations != "float" and activations not in allowed:
            raise ValueError(f"{activations} activations do not pair with {self.kind} weights")
        self.activations = activations

    # ---- product ---------------------------------------------------------------------
    def _rounded(self, x: torch.Tensor) -> torch.Tensor:
        """The activations the product multiplies: x, or x rounded as `activations` says."""
        if self.activations == "fp8":
            return fake_quantize_fp8_rows(x).to(x.dtype)
        if self.activations == "fp4":
            return fake_quantize_fp4_rows(x, self.kind).to(x.dtype)
        return x

    def _product(self, x: torch.Tensor, out_float32: bool) -> torch.Tensor:
        x = self._rounded(x)
        if x.is_cuda:  # Triton: each weight tile decoded in registers
            from kernels.fp_matmul import fp_matmul
            y = fp_matmul(x.reshape(-1, self.in_features).contiguous(), self.weight_format())
            if self.bias is not None:
                y = y + self.bias
            y = y.view(*x.shape[:-1], self.out_features)
            return y.float() if out_float32 else y
        return cpu_fp_linear(x, self.weight_format(), self.bias, out_float32=out_float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, out_float32=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The product in float32 (an LM head stored in one of these formats)."""
        return self._product(hidden, out_float32=True)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.format_name}"
                + (f", {self.activations} activations" if self.activations != "float" else ""))


class ShardedLinear(nn.Module):
    """A fused projection (q/k/v, gate/up) whose parts a checkpoint stores with their own
    scales: the parts' outputs side by side, y = [x @ W_0^T, x @ W_1^T, ...].  Each part
    keeps its file's scales, so the bytes held are the file's."""

    bias: nn.Parameter | None

    def __init__(self, parts: list[FloatCodeLinear], bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)  # (..., sum of N)
        return y if self.bias is None else y + self.bias


class StackedFloatCodes(nn.Module):
    """One MoE layer's routed-expert matrices (E, N, K) stored as fp8, mxfp4 or nvfp4:
    the experts' codes and scales stacked along a leading expert dimension, nothing in
    float.  `expert(e)` is expert e's `FloatQuantWeight` (views of the stacked buffers),
    which the MoE reference path multiplies a slice of decoded rows at a time."""

    codes: torch.Tensor  # fp8: (E, N, K) float8_e4m3fn; fp4: (E, N, K // 2) uint8
    scales: torch.Tensor  # (E, ...) each expert's scales, as FloatCodeLinear's
    global_scale: torch.Tensor | None  # nvfp4: (E,) float32, one per expert matrix

    def __init__(self, experts: list[FloatQuantWeight]) -> None:
        super().__init__()
        first = experts[0]
        self.kind = ("fp8" if isinstance(first, Fp8Weight) else
                     "mxfp4" if isinstance(first, Mxfp4Weight) else "nvfp4")
        self.block_n = first.block_n if isinstance(first, Fp8Weight) else 0
        self.block_k = first.block_k if isinstance(first, Fp8Weight) else 0
        self.register_buffer("codes", torch.stack(
            [w.codes if isinstance(w, Fp8Weight) else w.packed for w in experts]))
        self.register_buffer("scales", torch.stack([w.scales for w in experts]))
        self.register_buffer("global_scale", torch.stack(
            [w.global_scale.reshape(()) for w in experts if isinstance(w, Nvfp4Weight)])
            if isinstance(first, Nvfp4Weight) else None)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K) of the float matrices."""
        e, n, k = self.codes.shape
        return int(e), int(n), int(k) * (1 if self.kind == "fp8" else 2)

    def expert(self, e: int) -> FloatQuantWeight:
        if self.kind == "fp8":
            return Fp8Weight(self.codes[e], self.scales[e], self.block_n, self.block_k)
        if self.kind == "mxfp4":
            return Mxfp4Weight(self.codes[e], self.scales[e])
        assert self.global_scale is not None
        return Nvfp4Weight(self.codes[e], self.scales[e], self.global_scale[e])

    @property
    def format_name(self) -> str:
        """As FloatCodeLinear's: fp8/tensor, fp8/channel, fp8/block, mxfp4, nvfp4."""
        fmt = self.expert(0)
        return f"fp8/{fmt.granularity}" if isinstance(fmt, Fp8Weight) else self.kind

    def dequantized(self) -> torch.Tensor:
        """(E, N, K) float32: what the expert products multiply by."""
        return torch.stack([self.expert(e).dequantize() for e in range(self.shape[0])])

    @property
    def stored_bytes(self) -> int:
        """Bytes of the codes and scales of all experts."""
        return sum(self.expert(e).nbytes for e in range(self.shape[0]))

    def expert_bytes(self) -> int:
        """Bytes of one expert's matrix as stored."""
        return self.expert(0).nbytes

    def extra_repr(self) -> str:
        e, n, k = self.shape
        return f"experts={e}, out_features={n}, in_features={k}, {self.format_name}"


def stacked_float_codes(w: torch.Tensor, weights: str, fp8_scales: str) -> StackedFloatCodes:
    """Round-to-nearest `quant.weights` fp8 / mxfp4 / nvfp4 of stacked expert matrices
    (E, N, K), each expert's matrix quantized as one matrix (its own scales)."""
    return StackedFloatCodes([quantize_float_format(m, weights, fp8_scales) for m in w])


def float_code_linear(linear: nn.Linear, weights: str, fp8_scales: str) -> FloatCodeLinear:
    """Round-to-nearest `quant.weights` fp8 / mxfp4 / nvfp4 of one float projection."""
    w = linear.weight
    return FloatCodeLinear(quantize_float_format(w, weights, fp8_scales), linear.bias, w.dtype)


def use_float_activations(model: nn.Module, activations: str) -> int:
    """`quant.activations` fp8 / fp4 on every FloatCodeLinear of `model`; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, FloatCodeLinear):
            module.set_activations(activations)
            count += 1
    return count
