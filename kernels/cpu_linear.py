"""Decode GEMV / skinny GEMM on the CPU (C++ `kernels/csrc/linear.cpp`), with its reference.

`cpu_linear(x, w)` is x (M, K) @ w (N, K)^T in float32 or bfloat16 with float32
accumulation: every thread streams its own contiguous slice of weight rows, so batch-1
decode runs at the machine's read bandwidth (see linear.cpp for the blocking).  For
large M (prefill) a BLAS GEMM is faster: `MAX_ROWS` is where the caller switches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cost import KernelCost
from kernels.cpu_ops import module

# Up to this many activation rows the C++ kernel runs; above it F.linear (MKL / oneDNN)
# wins because its GEMM blocks for the caches and its kernels reach the FLOP peak.
MAX_ROWS = 32


def cpu_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               out_float32: bool = False) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T [+ bias (N,)] -> (M, N) in x's dtype (float32 if out_float32)."""
    return module().linear(x, w, bias, out_float32)  # type: ignore[no-any-return]


def cpu_linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                   out_float32: bool = False) -> torch.Tensor:
    """Reference: the same product in float32, cast to x's dtype unless out_float32."""
    out = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    return out if out_float32 else out.to(x.dtype)


def cpu_linear_cost(m: int, n: int, k: int, elem_bytes: int) -> KernelCost:
    return KernelCost(flops=2 * m * n * k, bytes=(n * k + m * k + m * n) * elem_bytes)
