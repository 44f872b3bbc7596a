"""Per-step routing statistics of an MoE model, beside the cost model's uniform-routing view.

After each step the engine reads how many tokens every routed expert of every MoE layer
received (`model.moe.take_routing_counts`) and records, in the StepRecord: the experts
touched (at least one token) summed over the layers, the bytes of their weights (what a
step must read), the same two under uniform routing as the roofline prices them
(E * (1 - (1 - k/E)^T) experts per layer for T tokens, `MoEConfig.expected_distinct_experts`)
and the skew of the counts (max/mean tokens per expert and their coefficient of variation,
averaged over the layers).
"""

from __future__ import annotations

import math
from typing import Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.engine.records import MoEStep
from infbench.model.moe import take_routing_counts
from infbench.roofline.shapes import is_moe_layer, layer_weights


def analytic_expert_bytes(cfg: ModelConfig, dtype_bytes: int,
                          quant: QuantConfig | None = None) -> float:
    """Bytes of one routed expert's weights as the cost model prices them."""
    spec = next(s for s in cfg.layers() if is_moe_layer(cfg, s))
    quant = quant or QuantConfig()
    return sum(w.nbytes(quant, dtype_bytes) / w.count for w in layer_weights(cfg, spec)
               if w.expert)


def summarize_counts(counts: list[list[int]], top_k: int, expert_bytes: int,
                     cfg: ModelConfig, analytic_bytes: float) -> MoEStep:
    """Routing counts (layers x experts) of one step -> MoEStep."""
    moe = cfg.moe
    assert moe is not None
    touched = sum(sum(1 for c in row if c) for row in counts)
    num_tokens = sum(counts[0]) // top_k if counts else 0
    expected = len(counts) * moe.expected_distinct_experts(num_tokens)
    ratios, cvs = [], []
    for row in counts:
        mean = sum(row) / len(row)
        if mean == 0:
            continue
        ratios.append(max(row) / mean)
        cvs.append(math.sqrt(sum((c - mean) ** 2 for c in row) / len(row)) / mean)
    return MoEStep(
        num_tokens=num_tokens, experts_touched=touched, expert_bytes=touched * expert_bytes,
        expected_experts=expected, expected_bytes=expected * analytic_bytes,
        max_over_mean=sum(ratios) / len(ratios) if ratios else 0.0,
        cv=sum(cvs) / len(cvs) if cvs else 0.0)


class RoutingRecorder:
    """Reads and clears the model's routing counts once per engine step."""

    def __init__(self, model: Any, cfg: ModelConfig, dtype_bytes: int) -> None:
        from infbench.model.moe import moe_layers, routed_expert_bytes

        assert cfg.moe is not None
        self.model, self.cfg = model, cfg
        self.layers = moe_layers(model)  # walked once, read every step
        self.expert_bytes = routed_expert_bytes(model)  # as stored in the engine
        self.analytic_bytes = analytic_expert_bytes(cfg, dtype_bytes)

    def reset(self) -> None:
        take_routing_counts(self.model, self.layers)  # drop what warm-up forwards routed

    def take(self) -> MoEStep | None:
        counts = take_routing_counts(self.model, self.layers)
        if counts is None:
            return None
        assert self.cfg.moe is not None
        return summarize_counts(counts, self.cfg.moe.num_experts_per_tok, self.expert_bytes,
                                self.cfg, self.analytic_bytes)
