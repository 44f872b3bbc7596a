"""The one factory for every projection in the model.

Weight-only quantization swaps the implementation here and nowhere else: the
attention, MLP and LM-head code only ever calls `make_linear`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from infbench.config import QuantConfig
from infbench.errors import ConfigError


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
    weights = quant.weights if quant is not None else "none"
    if weights == "none":
        return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)
    raise ConfigError(
        f"quant.weights={weights!r}: weight-quantized linears are not implemented yet; "
        "weight quantization runs come with the quantization work (use quant.weights: none)"
    )


def use_cpu_gemv_layout(model: nn.Module) -> int:
    """Store every nn.Linear weight column-major (a (K, N) buffer seen as (N, K)) on CPU.

    Decode at small batch is a GEMV per projection.  With the weight read as a
    contiguous (K, N) matrix, MKL/OpenBLAS stream it at about twice the bandwidth of
    the row-major (N, K) GEMV (measured on the 2-core dev machine: SmolLM2's
    49152 x 576 LM head 11.8 -> 23.9 GB/s at batch 1; within 10-20% either way at
    batch >= 4).  Values, shapes and parameter names are unchanged, so loaders and
    state dicts still see nn.Linear weights; only the strides differ.  GPU weights are
    left alone (cuBLAS handles both layouts alike).  Idempotent; returns how many
    weights moved.
    """
    moved = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.device.type == "cpu":
            w = module.weight
            if w.dim() == 2 and w.stride() == (w.shape[1], 1) and w.shape[0] > 1:
                # (N, K) row-major -> same values in a (K, N)-contiguous buffer
                w.data = w.data.t().contiguous().t()
                moved += 1
    return moved
