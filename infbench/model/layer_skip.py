"""The first N decoder layers of a model, as a model of their own (a self-draft).

`first_layers(model, n)` returns a `Transformer` that shares every weight with `model`
(embedding, the first n layers, final norm, LM head: nothing is copied) and runs only
those n layers: the layer-skipping self-draft of speculative decoding (Draft & Verify,
LayerSkip's early exit without its training recipe).  Its config says n layers, so a KV
cache built for it holds n layers.
"""

from __future__ import annotations

import copy

from torch import nn

from infbench.core.errors import ConfigError
from infbench.model.transformer import Transformer


def first_layers(model: Transformer, n: int) -> Transformer:
    total = len(model.layers)
    if not 1 <= n <= total:
        raise ConfigError(f"draft_layers={n}: the model has {total} layers; keep 1..{total}")
    view = copy.copy(model)  # same tensors; the module dicts are replaced below
    view._modules = dict(model._modules)
    view._parameters = dict(model._parameters)
    view._buffers = dict(model._buffers)
    view.layers = nn.ModuleList(list(model.layers)[:n])
    # the first n layers keep their kinds (Llama-4's NoPE layers among them)
    view.config = model.config.with_overrides(
        num_layers=n, nope_layers=tuple(i for i in model.config.nope_layers if i < n))
    view.layer_specs = model.layer_specs[:n]
    fused = getattr(model, "decode_layers", None)
    if fused is not None:
        view.decode_layers = fused[:n]
    return view
