"""Speculative decoding settings: the proposers, defined once, and the frozen config the engine,
the analytic model and the gate read (the scenario's `speculative:` section is derived from its
fields and their docstrings, scenario/engine.py)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from infbench.core.config import check_count, check_real
from infbench.core.errors import ConfigError
from infbench.core.formats import DraftQuant, Int4GroupSize

SpeculativeMethod = Literal["none", "ngram", "draft", "medusa", "eagle", "mtp"]
SPECULATIVE_METHODS: tuple[str, ...] = typing.get_args(SpeculativeMethod)
# The methods whose proposer is a trained head checkpoint (`infbench train-draft`).
HeadMethod = Literal["medusa", "eagle"]
HEAD_METHODS: tuple[str, ...] = typing.get_args(HeadMethod)
assert set(HEAD_METHODS) <= set(SPECULATIVE_METHODS)
# The most draft tokens per step (k) a scenario or a flag may ask for: each is a verified
# position of every step, and past a few dozen acceptance makes the rest dead weight.
MAX_SPEC_TOKENS = 1024


@dataclass(frozen=True)
class SpeculativeConfig:
    """The scenario's `speculative` section, resolved (draft_cost_ratio filled in)."""

    method: SpeculativeMethod = "none"
    """ngram: prompt lookup; draft: a draft model (by default the target itself, cut by
    draft_layers or quantized by draft_quant); medusa / eagle: heads trained by
    `infbench train-draft` (checkpoint in `heads`); mtp: DeepSeek-V3's multi-token-prediction
    module stored in the target's checkpoint (num_tokens 1: the module once, as trained; more:
    applied again on its own output)."""
    num_tokens: int = 4
    """Draft tokens proposed per step (k)."""
    acceptance: float = 0.7
    """`infbench predict` only: per-token acceptance probability a (a run measures it)."""
    draft_cost_ratio: float = 0.0
    """`infbench predict` only: cost of one draft step relative to one target step
    (default: ngram 0, draft 0.1; mtp 0: priced from the MTP module's own layer and head;
    a run measures it)."""
    draft_model: str | None = None
    """method draft: a preset, HF directory or .gguf sharing the target's vocabulary;
    unset: the target's own weights."""
    draft_layers: int | None = None
    """method draft: keep only the draft's first N layers (the layer-skipping self-draft
    when the draft is the target)."""
    draft_quant: DraftQuant = "none"
    """method draft: quantize the draft's projections (int4 in groups of draft_group_size)
    and its LM head (int8): the quantized target as its own draft."""
    draft_group_size: Int4GroupSize = 64
    heads: str | None = None
    """method medusa / eagle: the head checkpoint written by `infbench train-draft`."""
    ngram_max: int = 4
    """method ngram: the longest suffix looked up."""
    ngram_min: int = 1

    def __post_init__(self) -> None:
        # The priced numbers, checked for callers of the analytic model that build a config
        # by hand (the scenario's section bounds them before it gets here).
        check_count("speculative", "num_tokens", self.num_tokens, MAX_SPEC_TOKENS)
        check_real("speculative", "acceptance", self.acceptance, allow_zero=True)
        if not 0.0 <= self.acceptance <= 1.0:
            raise ConfigError(f"speculative.acceptance must be in [0, 1], got {self.acceptance}")
        check_real("speculative", "draft_cost_ratio", self.draft_cost_ratio, allow_zero=True)

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def expected_tokens(self) -> float:
        """Expected tokens emitted per verification step (accepted drafts + one target token):
        (1 - a^(g+1)) / (1 - a) for g drafts at acceptance a (Leviathan et al.)."""
        g, a = self.num_tokens, self.acceptance
        return float(g + 1) if a >= 1.0 else (1.0 - a ** (g + 1)) / (1.0 - a)

    def priced(self) -> dict[str, float]:
        """The three numbers the analytic model prices (a prediction's JSON carries them)."""
        return {"num_tokens": self.num_tokens, "acceptance": self.acceptance,
                "draft_cost_ratio": self.draft_cost_ratio}

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
