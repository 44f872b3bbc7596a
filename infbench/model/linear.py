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
