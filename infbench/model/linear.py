"""The one factory for every projection in the model, and the CPU paths of projections.

The attention, MLP and LM-head code only ever calls `make_linear`.  Weight quantization
replaces these modules after the checkpoint is read (`model/quant.quantize_model`), so the
loaders always copy float checkpoint rows into plain nn.Linear weights first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import QuantConfig
from kernels.cpu_linear import MAX_ROWS, cpu_linear, gemm  # no build on import: first call builds


def make_linear(
    in_features: int,
    out_features: int,
    bias: bool = False,
    quant: QuantConfig | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: Any = None,
) -> nn.Module:
    """A module mapping (T, in_features) -> (T, out_features), built on `device` in `dtype`.

    The weight has nn.Linear's layout (out_features, in_features) so loaders can copy
    checkpoint rows into it.
    """
    del quant  # weights are quantized after loading (model/quant.quantize_model)
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)



# Below this many rows a CPU matmul goes through `split_linear` (measured crossover on the
# 2-core dev machine: split 156-189 GFLOP/s vs MKL 91-144 at M=128, even from M=512 on).
SPLIT_MAX_ROWS = 256


def split_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 parts: int | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T with the output rows split across CPU threads.

    MKL runs a GEMV (and small-M GEMMs) on one core, which streams weights at about
    12-18 GB/s here, half of what the two cores read together.  Viewing the row-major
    weight as (parts, N / parts, K) and calling bmm gives each thread its own slice of
    rows: SmolLM2's 30 layers + LM head went from 12 to 30-43 GB/s at batch 1 and
    stayed ahead up to M = 256 (see SPLIT_MAX_ROWS).  Same values as F.linear up to
    float rounding; falls back to it when N does not split evenly.
    """
    parts = parts or torch.get_num_threads()
    n, k = weight.shape
    m = x.shape[0]
    if parts < 2 or m > SPLIT_MAX_ROWS or n % parts or not weight.is_contiguous() or x.dim() != 2:
        return F.linear(x, weight, bias)
    out = torch.bmm(weight.view(parts, n // parts, k),  # (P, N/P, K)
                    x.t().unsqueeze(0).expand(parts, k, m))  # (P, K, M) -> (P, N/P, M)
    out = out.view(n, m).t()  # (M, N), column-major
    if m > 1:
        out = out.contiguous()  # downstream kernels want contiguous rows
    return out + bias if bias is not None else out


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out_float32: bool = False) -> torch.Tensor:
    """The `cpu` backend's projection: the C++ GEMV/skinny GEMM (kernels/cpu_linear.py) up to
    its MAX_ROWS activation rows, F.linear (MKL / oneDNN GEMM) above, where the BLAS wins."""
    if (x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype == weight.dtype
            and x.dtype in (torch.float32, torch.bfloat16)):
        return cpu_linear(x, weight, bias, out_float32)
    return gemm(x, weight, bias, out_float32)


class CpuKernelLinear(nn.Linear):
    """nn.Linear whose forward is `kernel_linear` (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_linear(x, self.weight, self.bias)


def use_cpu_linears(model: nn.Module, backend: str) -> int:
    """Give every CPU nn.Linear of `model` the CPU path of `backend`; returns how many.
    Quantized projections (`model/quant.QuantLinear`, `model/llm_int8.LLMInt8Linear`: any
    module with a `set_backend` method) are told the backend instead.

    `cpu`: the C++ kernel (`CpuKernelLinear`); any other backend: `CpuSplitLinear`
    (the torch row-splitting fallback).  Only the class changes: parameters, names and
    views of them stay valid.  GPU modules are left alone; idempotent.
    """
    cls = CpuKernelLinear if backend == "cpu" else CpuSplitLinear
    moved = 0
    for module in model.modules():
        set_backend = getattr(module, "set_backend", None)
        if callable(set_backend):
            set_backend(backend)
            moved += 1
            continue
        if (type(module) in (nn.Linear, CpuKernelLinear, CpuSplitLinear)
                and module.weight.device.type == "cpu"):
            module.__class__ = cls
            moved += 1
    return moved


def tied_logits(hidden: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    """hidden (N, H) x weight (V, H) -> float32 logits (N, V) for a tied LM head, through
    the CPU path of `backend` (the C++ kernel for `cpu`, `split_linear` otherwise)."""
    if hidden.device.type != "cpu":
        return F.linear(hidden, weight).float()
    if backend == "cpu":
        return kernel_linear(hidden, weight, None, out_float32=True)
    return split_linear(hidden, weight).float()


class CpuSplitLinear(nn.Linear):
    """nn.Linear whose forward uses `split_linear` (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return split_linear(x, self.weight, self.bias)
        return super().forward(x)
