"""The records the cost model exchanges: one sequence's work in a step, one operator's cost.

`SeqWork` is the batch composition the engine's scheduler produces (how many new
tokens a sequence computes and how much KV it attends over); `OpCost` is what the
cost model returns for one operator, with its bytes split by where they come from
(weights, KV cache, recurrent state, activations) so MBU can be attributed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from infbench.core.errors import ConfigError

# Operator kinds, used for colouring plots and for choosing what a test asserts on.
OP_KINDS = ("matmul", "attention", "scan", "elementwise", "gather")


@dataclass(frozen=True)
class SeqWork:
    """One sequence in one engine step.

    query_len: tokens computed this step (the prompt or a prefill chunk, 1 when
        decoding, g+1 when verifying g speculative tokens).
    context_len: tokens of KV the sequence attends over, the new ones included.
    num_logits: tokens that need logits (1: the last one; 0: a prefill chunk that is
        not the last; query_len: speculative verification).
    """

    query_len: int
    context_len: int
    num_logits: int = 1

    def __post_init__(self) -> None:
        # `not >=` rather than `<` so that a NaN is refused too.
        if not self.query_len >= 1:
            raise ConfigError(f"query_len must be >= 1, got {self.query_len}")
        if not self.context_len >= self.query_len:
            raise ConfigError(
                f"context_len ({self.context_len}) must include the query_len "
                f"({self.query_len}) new tokens"
            )
        if not 0 <= self.num_logits <= self.query_len:
            raise ConfigError(
                f"num_logits must be in 0..query_len ({self.query_len}), got {self.num_logits}"
            )


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes of one operator (one layer, or summed over layers by name).

    stage: "step" from `step_costs`; analysis relabels it "prefill" or "decode".
    layer: the layer index, or None for model-level ops and name aggregates.
    """

    name: str
    kind: str
    flops: float
    weight_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    state_bytes: float = 0.0  # recurrent state (linear attention, SSM) read + written
    act_bytes: float = 0.0
    stage: str = "step"
    layer: int | None = None

    @property
    def bytes(self) -> float:
        return (
            self.weight_bytes
            + self.kv_read_bytes
            + self.kv_write_bytes
            + self.state_bytes
            + self.act_bytes
        )

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte (0 for an operator that moves nothing)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def plus(self, other: OpCost) -> OpCost:
        return replace(
            self,
            flops=self.flops + other.flops,
            weight_bytes=self.weight_bytes + other.weight_bytes,
            kv_read_bytes=self.kv_read_bytes + other.kv_read_bytes,
            kv_write_bytes=self.kv_write_bytes + other.kv_write_bytes,
            state_bytes=self.state_bytes + other.state_bytes,
            act_bytes=self.act_bytes + other.act_bytes,
        )

    def scaled(self, factor: float) -> OpCost:
        return replace(
            self,
            flops=self.flops * factor,
            weight_bytes=self.weight_bytes * factor,
            kv_read_bytes=self.kv_read_bytes * factor,
            kv_write_bytes=self.kv_write_bytes * factor,
            state_bytes=self.state_bytes * factor,
            act_bytes=self.act_bytes * factor,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "stage": self.stage,
            "layer": self.layer,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "weight_bytes": self.weight_bytes,
            "kv_read_bytes": self.kv_read_bytes,
            "kv_write_bytes": self.kv_write_bytes,
            "state_bytes": self.state_bytes,
            "act_bytes": self.act_bytes,
        }


def merge_by_name(ops: Iterable[OpCost]) -> list[OpCost]:
    """Sum operators that share a name, in order of first appearance (layer set to None)."""
    merged: dict[str, OpCost] = {}
    for op in ops:
        if op.name in merged:
            merged[op.name] = merged[op.name].plus(op)
        else:
            merged[op.name] = replace(op, layer=None)
    return list(merged.values())


def total(ops: Iterable[OpCost], name: str = "total", stage: str = "step") -> OpCost:
    """One OpCost holding the sum of all the given operators."""
    acc = OpCost(name, "matmul", 0.0, stage=stage)
    for op in ops:
        acc = acc.plus(op)
    return acc
