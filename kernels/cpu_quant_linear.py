"""Weight-only int8 / int4 projections on the CPU (C++ in `kernels/csrc/linear.cpp`), with
their references.

`cpu_quant_linear(x, w)` is x (M, K) @ w.dequantize()^T for an `Int8Weight` or `Int4Weight`
(`kernels/quant_format.py`), M <= MAX_ROWS: each thread takes a contiguous slice of weight
rows, dequantizes a chunk of rows into an L1-resident fp32 buffer and multiplies it with
the activation rows, so only the packed bytes cross the memory bus.  For more rows
(prefill) `cpu_dequantize` rebuilds the float matrix (multi-threaded) for a BLAS GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cost import KernelCost
from kernels.cpu_ops import module
from kernels.quant_format import Int4Weight, Int8Weight

MAX_ROWS = 32


def _parts(w: Int8Weight | Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if isinstance(w, Int8Weight):
        return w.q, w.scales, None
    return w.packed, w.scales, w.mins


def cpu_quant_linear(x: torch.Tensor, w: Int8Weight | Int4Weight,
                     bias: torch.Tensor | None = None, out_float32: bool = False,
                     act_int8: bool = False) -> torch.Tensor:
    """x (M, K) float32/bfloat16 @ dequant(w)^T [+ bias] -> (M, N) in x's dtype.

    act_int8: x is rounded to int8 in blocks of 32 columns (one scale each); on a CPU with
    AVX512-VNNI the codes are multiplied with integer dot products (`linear_q8act.cpp`: int4
    weights up to 32 rows, int8 up to 4), elsewhere the float path runs on the rounded values.
    """
    q, scales, mins = _parts(w)
    return module().quant_linear(x, q, scales, mins, w.group_size, bias,  # type: ignore[no-any-return]
                                 out_float32, act_int8)


def cpu_quant_linear_ref(x: torch.Tensor, w: Int8Weight | Int4Weight,
                         bias: torch.Tensor | None = None,
                         out_float32: bool = False) -> torch.Tensor:
    """Reference: dequantize, then the product in float32."""
    out = F.linear(x.float(), w.dequantize(), None if bias is None else bias.float())
    return out if out_float32 else out.to(x.dtype)


def cpu_dequantize(w: Int8Weight | Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """dequant(w) (N, K) in dtype (float32 or bfloat16), multi-threaded."""
    q, scales, mins = _parts(w)
    return module().quant_dequantize(q, scales, mins, w.group_size, dtype)  # type: ignore[no-any-return]


def cpu_dequantize_ref(w: Int8Weight | Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    return w.dequantize().to(dtype)


def cpu_quant_linear_cost(m: int, w: Int8Weight | Int4Weight, act_bytes: int) -> KernelCost:
    n, k = w.shape
    return KernelCost(flops=2 * m * n * k, bytes=w.nbytes + (m * k + m * n) * act_bytes)
