"""The CPU path of FP8 / MXFP4 / NVFP4 projections (`kernels/fp_format.py`) in torch.

`cpu_fp_linear(x, w)` decodes a slice of weight rows at a time into a float32 buffer of
at most CHUNK_VALUES values and multiplies it with all the activation rows, so the whole
matrix never exists in float (the model keeps only the stored bytes, and the working set
of one step stays a buffer, not a copy of the layer).  The values are exactly those of
`w.dequantize()`; the products are float32 GEMMs (BLAS) on the decoded slices.
"""

from __future__ import annotations

import torch

from kernels.cost import KernelCost
from kernels.fp_format import FloatQuantWeight

CHUNK_VALUES = 1 << 18  # decoded weights per slice: 1 MiB of float32


def rows_per_chunk(k: int) -> int:
    """Weight rows decoded at once for an input dimension k (at least one)."""
    return max(1, CHUNK_VALUES // max(k, 1))


def cpu_fp_linear(x: torch.Tensor, w: FloatQuantWeight, bias: torch.Tensor | None = None,
                  out_float32: bool = False) -> torch.Tensor:
    """x (..., K) @ dequant(w)^T [+ bias] -> (..., N) in x's dtype (float32 with
    out_float32), float32 products over slices of decoded rows."""
    n, k = w.shape
    flat = x.reshape(-1, k).float()  # (M, K)
    out = torch.empty(flat.shape[0], n, dtype=torch.float32, device=x.device)  # (M, N)
    step = rows_per_chunk(k)
    for start in range(0, n, step):
        stop = min(n, start + step)
        out[:, start:stop] = flat @ w.dequantize_rows(start, stop).t()
    if bias is not None:
        out += bias.float()
    out = out.view(*x.shape[:-1], n)
    return out if out_float32 else out.to(x.dtype)


def cpu_fp_linear_cost(m: int, w: FloatQuantWeight, act_bytes: int) -> KernelCost:
    n, k = w.shape
    return KernelCost(flops=2.0 * m * n * k, bytes=float(w.nbytes + (m * k + m * n) * act_bytes))
