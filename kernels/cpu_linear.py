"""Decode GEMV / skinny GEMM on the CPU (C++ `kernels/csrc/linear.cpp`), with its reference.

`cpu_linear(x, w)` is x (M, K) @ w (N, K)^T in float32 or bfloat16 with float32
accumulation: every thread streams its own contiguous slice of weight rows, so batch-1
decode runs at the machine's read bandwidth (see linear.cpp for the blocking).  For
large M (prefill) a BLAS GEMM is faster: `MAX_ROWS` is where the caller switches.
"""

from __future__ import annotations

import functools
import os
import time

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


BF16_GEMM_ENV = "INFBENCH_BF16_GEMM"  # native | float32: skip the measurement


@functools.cache
def bf16_gemm_via_float32() -> bool:
    """Whether a bfloat16 GEMM (prefill, more than MAX_ROWS rows) runs faster here as a
    float32 GEMM of the widened operands, rounded back to bfloat16.

    CPUs differ: with AMX or a fast AVX-512 BF16 path in oneDNN the bf16 GEMM wins (about 4x
    fp32 on one AMD dev machine); on the 2-core Emerald Rapids dev machine oneDNN's bf16
    GEMM ran at 150 GFLOP/s against MKL's fp32 240.  Measured once per process on a
    SmolLM2-sized GEMM (512 x 576 by 1536 x 576, best of 3 each way); float32 is chosen only
    when it is at least 1.2x faster.  `INFBENCH_BF16_GEMM=native|float32` fixes the choice.
    The float32 path is the more accurate one (no bf16 rounding inside the sum).
    """
    forced = os.environ.get(BF16_GEMM_ENV, "").strip().lower()
    if forced in ("native", "float32"):
        return forced == "float32"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 576, generator=gen).bfloat16()
    w = torch.randn(1536, 576, generator=gen).bfloat16()

    def best(fn: object) -> float:
        assert callable(fn)
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    native = best(lambda: F.linear(x, w))
    widened = best(lambda: F.linear(x.float(), w.float()).bfloat16())
    return widened * 1.2 < native


def gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
         out_float32: bool = False) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T [+ bias] through the BLAS (the M > MAX_ROWS side), a bfloat16
    product in float32 when `bf16_gemm_via_float32()` says that is faster here."""
    if x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and bf16_gemm_via_float32():
        out = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        return out if out_float32 else out.to(torch.bfloat16)
    out = F.linear(x, w, None if bias is None else bias.to(x.dtype))
    return out.float() if out_float32 else out


def cpu_linear_cost(m: int, n: int, k: int, elem_bytes: int) -> KernelCost:
    return KernelCost(flops=2 * m * n * k, bytes=(n * k + m * k + m * n) * elem_bytes)
