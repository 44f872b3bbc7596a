"""Speculative decoding settings: the methods, defined once, and the frozen config the engine,
the analytic model and the gate read (the scenario's `speculative:` section documents the keys)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

SpeculativeMethod = Literal["none", "ngram", "draft", "medusa", "eagle"]
SPECULATIVE_METHODS: tuple[str, ...] = typing.get_args(SpeculativeMethod)
# The methods whose proposer is a trained head checkpoint (`infbench train-draft`).
HEAD_METHODS: tuple[str, ...] = ("medusa", "eagle")


@dataclass(frozen=True)
class SpeculativeConfig:
    """The scenario's `speculative` section (SpeculativeSection documents the keys)."""

    method: str = "none"  # one of SPECULATIVE_METHODS
    num_tokens: int = 4
    acceptance: float = 0.7  # predict only
    draft_cost_ratio: float = 0.0  # predict only
    draft_model: str | None = None
    draft_layers: int | None = None
    draft_quant: str = "none"
    draft_group_size: int = 64
    heads: str | None = None
    ngram_max: int = 4
    ngram_min: int = 1

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def label(self) -> str:
        """method and its draft, e.g. `draft(layers 8)`, `draft(int4)`, `ngram`."""
        if self.method != "draft":
            return self.method
        parts = [] if self.draft_model is None else [self.draft_model]
        if self.draft_layers is not None:
            parts.append(f"layers {self.draft_layers}")
        if self.draft_quant != "none":
            parts.append(self.draft_quant if self.draft_quant == "int8"
                         else f"int4-g{self.draft_group_size}")
        return f"draft({', '.join(parts) or 'target'})"
