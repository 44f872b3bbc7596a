"""Structured pruning measured on calibration text: whole layers and MLP width.

Two methods, applied in this order by `apply_prune` (`model.prune`, `infbench prune`):

- Layer dropping (ShortGPT, Men et al. 2024): a layer's Block Influence is
  1 - the mean cosine similarity between its input and output hidden states over the
  calibration tokens.  A layer that barely turns the residual stream does little; the
  `k` layers with the lowest score go.  The layers left keep their weights and are
  renumbered, so the engine sizes one KV cache per remaining layer.
- MLP-width pruning: every SwiGLU MLP keeps the intermediate channels with the largest
  mean |silu(gate) * up| on the calibration tokens (measured after the layers are
  dropped, on the model that remains).  The same fraction goes in every layer, so one
  `intermediate_size` describes the pruned model and `roofline/shapes.py` prices it.

Both run dense forwards on the calibration split of the evaluation text, in windows of
512 tokens (`model/calibration.py`, shared with AWQ and LLM.int8()); a model without a
tokenizer is calibrated on seeded random token ids, and `LoadedModel.source` says so.
The target shape comes from `PruneConfig.pruned_shape`, the function `infbench predict`
prices, and the pruned model is checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import nn

from infbench.core.config import ModelConfig, PruneConfig
from infbench.core.errors import ConfigError
from infbench.model.calibration import (
    CALIBRATION_WINDOW,
    InputStats,
    calibration_ids,
    for_each_layer,
)
from infbench.model.context import DenseContext
from infbench.model.layers import SwiGLUMLP
from infbench.model.quant import QuantLinear, stored_weight_bytes
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import DecoderLayer, Transformer


@dataclass
class PruneReport:
    """What `apply_prune` measured and removed."""

    layer_scores: list[float]  # Block Influence of every original layer (empty: none dropped)
    dropped_layers: list[int]  # original indices, ascending
    mlp_width: tuple[int, int]  # intermediate channels per MLP (before, after)
    calibration_tokens: int
    calibration_source: str  # what the calibration ids were (text or random ids)


class Loaded(Protocol):
    """What pruning reads and updates of `loader.LoadedModel` (which imports this module)."""

    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer | None
    weight_bytes: int
    source: str


# ------------------------------------------------------------ calibration windows
def windows_of(ids: Sequence[int] | torch.Tensor, window: int) -> list[torch.Tensor]:
    """Consecutive windows of at most `window` tokens; the last may be shorter."""
    stream = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids,
                             dtype=torch.long)
    if stream.numel() == 0:
        raise ConfigError("calibration needs at least one token")
    return list(stream.split(window))


def _layer_inputs(model: Transformer, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                      DenseContext]:
    device = model.device
    ids = window.to(device)
    positions = torch.arange(ids.numel(), device=device)  # (L,)
    return model.embed(ids), positions, DenseContext.single(ids.numel(), model.config)


# ------------------------------------------------------------ layer importance
@torch.no_grad()
def block_influence(model: Transformer, windows: Sequence[torch.Tensor]) -> list[float]:
    """ShortGPT's Block Influence of every decoder layer: 1 - mean over calibration tokens
    of cos(layer input, layer output), the layers run one by one on dense forwards."""
    num_layers = len(model.layers)
    sums = torch.zeros(num_layers, dtype=torch.float64)
    count = 0
    for window in windows:
        x, positions, ctx = _layer_inputs(model, window)
        for i, layer in enumerate(model.layers):
            y = layer(x, positions, ctx, model.layer_rope(model.layer_specs[i]))  # (L, H)
            cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)  # (L,)
            sums[i] += cos.double().sum().cpu()
            x = y
        count += window.numel()
    return [float(1.0 - s / count) for s in sums]


def drop_layers(model: Transformer, k: int, scores: Sequence[float]) -> list[int]:
    """Remove the `k` layers with the lowest scores (of equal scores, the earlier layer goes);
    returns their original indices, ascending.  The model's config, layer specs and each
    mixer's LayerSpec are renumbered for the layers that remain."""
    n = len(model.layers)
    if not 0 <= k < n or len(scores) != n:
        raise ConfigError(f"prune.layers: cannot drop {k} of {n} layers (allowed: 0..{n - 1})")
    if k == 0:
        return []
    order = sorted(range(n), key=lambda i: (scores[i], i))
    dropped = sorted(order[:k])
    kept = [i for i in range(n) if i not in set(dropped)]
    config = model.config.with_overrides(num_layers=len(kept))
    specs = config.layers()
    old = model.layer_specs
    for new_index, old_index in enumerate(kept):
        a, b = old[old_index], specs[new_index]
        if (a.mixer, a.window, a.chunk, a.rope, a.owns_kv) != (
                b.mixer, b.window, b.chunk, b.rope, b.owns_kv):
            raise ConfigError(f"prune.layers: layer {old_index} ({a.mixer}) cannot become layer "
                              f"{new_index} ({b.mixer}) of the pruned model; allowed: 0")
    model.layers = nn.ModuleList(model.layers[i] for i in kept)
    for spec, layer in zip(specs, model.layers, strict=True):
        mixer = layer.self_attn
        if hasattr(mixer, "layer"):
            mixer.layer = spec  # the KV cache and contexts look layers up by index
    model.layer_specs = specs
    model.config = config
    return dropped


# ------------------------------------------------------------ MLP width
def _mlps(model: Transformer) -> list[SwiGLUMLP]:
    mlps = [cast(DecoderLayer, layer).mlp for layer in model.layers]
    if any(not isinstance(m, SwiGLUMLP) for m in mlps):
        raise ConfigError(f"prune.mlp_fraction: model {model.config.name!r} has layers without "
                          "a dense SwiGLU MLP; allowed: 0")
    return cast(list[SwiGLUMLP], mlps)


def mlp_channel_scores(model: Transformer, ids: Sequence[int]) -> list[torch.Tensor]:
    """Per layer, the mean |silu(gate) * up| of every intermediate channel (I,), float32:
    the mean magnitude of `down_proj`'s input, which is exactly that product, recorded by
    the calibration pass (`model/calibration.for_each_layer`)."""
    _mlps(model)
    scores: list[torch.Tensor] = []

    def record(_index: int, _layer: nn.Module, stats: dict[str, InputStats]) -> None:
        scores.append(stats["mlp.down_proj"].abs_mean.float().cpu())  # (I,)

    for_each_layer(model, list(ids), record)
    return scores


def _float_linear(module: nn.Module) -> nn.Linear:
    if isinstance(module, QuantLinear) or not isinstance(module, nn.Linear):
        raise ConfigError("prune: MLP projections must be float linears (pruning runs before "
                          "quantization)")
    return module


def _linear_like(old: nn.Linear, weight: torch.Tensor) -> nn.Linear:
    """A linear of the same class as `old` (nn.Linear or a CPU subclass) holding `weight`
    (out, in), no bias."""
    out_features, in_features = weight.shape
    new = type(old)(in_features, out_features, bias=False, dtype=weight.dtype,
                    device=weight.device)
    with torch.no_grad():
        new.weight.copy_(weight)
    new.weight.requires_grad_(old.weight.requires_grad)
    return new


def narrow_mlps(model: Transformer, width: int, scores: Sequence[torch.Tensor]) -> None:
    """Keep the `width` highest-scoring intermediate channels of every MLP (same width
    everywhere), rebuilding gate_up_proj's rows [gate; up] and down_proj's columns."""
    mlps = _mlps(model)
    for mlp, score in zip(mlps, scores, strict=True):
        size = mlp.intermediate_size
        if not 1 <= width <= size:
            raise ConfigError(f"prune.mlp_fraction: width {width} outside 1..{size}")
        if width == size:
            continue
        # Stable order: equal scores keep the lower channel index.
        keep = torch.sort(torch.argsort(score, descending=True, stable=True)[:width]).values
        gate_up, down = _float_linear(mlp.gate_up_proj), _float_linear(mlp.down_proj)
        keep = keep.to(gate_up.weight.device)
        rows = torch.cat([keep, keep + size])  # (2W,): the kept gate rows, then their up rows
        mlp.gate_up_proj = _linear_like(gate_up, gate_up.weight.detach()[rows])  # (2W, H)
        mlp.down_proj = _linear_like(down, down.weight.detach()[:, keep])  # (H, W)
        mlp.intermediate_size = width
    model.config = model.config.with_overrides(intermediate_size=width)


# ------------------------------------------------------------ the load-time pass
def apply_prune(loaded: Loaded, prune: PruneConfig, seed: int = 0) -> PruneReport:
    """Prune `loaded` in place (layers first, then MLP width); update its config, weight
    bytes and source.  The result has exactly `prune.pruned_shape(loaded.config)`."""
    model = loaded.model
    target: ModelConfig = prune.pruned_shape(loaded.config)
    if any(isinstance(m, QuantLinear) for m in model.modules()):
        raise ConfigError("model.prune: this model's projections are already quantized "
                          "(quant.weights: native); pruning needs float weights; allowed with "
                          "model.prune: quant.weights none, int8, int4")
    ids, what = calibration_ids(loaded.tokenizer, prune.calibration_tokens,
                                loaded.config.vocab_size, seed)
    windows = windows_of(ids, min(CALIBRATION_WINDOW, loaded.config.max_seq_len))
    before_width = loaded.config.intermediate_size
    scores: list[float] = []
    dropped: list[int] = []
    if prune.layers:
        scores = block_influence(model, windows)
        dropped = drop_layers(model, prune.layers, scores)
    if prune.mlp_fraction:
        width = prune.mlp_width(before_width)
        narrow_mlps(model, width, mlp_channel_scores(model, ids))
    if model.config != target:
        raise AssertionError(f"pruned model {model.config} != predicted shape {target}")
    loaded.config = target
    loaded.weight_bytes = stored_weight_bytes(model)
    parts = []
    if dropped:
        parts.append(f"layers {dropped} dropped by block influence")
    if prune.mlp_fraction:
        parts.append(f"MLP {before_width}->{target.intermediate_size} channels")
    if parts:
        loaded.source += f"; pruned: {', '.join(parts)} (calibration: {what})"
    return PruneReport(scores, dropped, (before_width, target.intermediate_size), len(ids),
                       what)
