"""Accuracy of a (quantized, pruned) model against its unquantized self of the same dtype.

`infbench eval` and every quantized point of `infbench run` call this: the candidate's
perplexity on the held-out test split of the evaluation text (`core/eval_text.py`) and
its free-running greedy continuations of fixed prompts, beside the reference model's
(the same source and dtype without `model.quant` / `model.prune`).  The measures
themselves are in `model/evaluate.py`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from infbench.core.errors import UserError
from infbench.core.eval_text import text_id
from infbench.model.evaluate import (
    AGREEMENT_POSITIONS,
    NUM_PROMPTS,
    eval_prompts,
    greedy_agreement,
    greedy_continuations,
    perplexity,
    token_ids,
)
from infbench.model.loader import LoadedModel

DEFAULT_EVAL_TOKENS = 2048
DEFAULT_WINDOW = 512


@dataclass(frozen=True)
class EvalPlan:
    """What is measured: perplexity tokens and window, agreement prompts and new tokens."""

    tokens: int = DEFAULT_EVAL_TOKENS
    window: int = DEFAULT_WINDOW
    num_prompts: int = NUM_PROMPTS
    new_tokens: int = AGREEMENT_POSITIONS

    def __post_init__(self) -> None:
        for name in ("tokens", "window", "num_prompts", "new_tokens"):
            if getattr(self, name) < (2 if name in ("tokens", "window") else 1):
                raise UserError(f"evaluation {name} must be >= "
                                f"{2 if name in ('tokens', 'window') else 1}, "
                                f"got {getattr(self, name)}")


@dataclass(frozen=True)
class ModelFigures:
    """One model's figures under a plan; continuations None when agreement is not asked."""

    perplexity: float
    continuations: list[list[int]] | None
    seconds: float


@dataclass(frozen=True)
class Accuracy:
    """A candidate's accuracy; the reference fields are None when it has no reference."""

    perplexity: float
    reference_perplexity: float | None
    perplexity_change: float | None  # perplexity / reference_perplexity - 1
    greedy_agreement: float | None  # fraction of matching positions, see model/evaluate.py
    tokens: int
    window: int
    agreement_prompts: int
    agreement_tokens: int
    text_id: str
    seconds: float  # candidate and reference measurement (loading not included)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_figures(loaded: LoadedModel, plan: EvalPlan, with_continuations: bool,
                  kv: str = "none") -> ModelFigures:
    """Perplexity (and the greedy continuations) of one loaded model; kv: its KV cache's
    quantization (none | int8 | fp8)."""
    if kv != "none":
        raise UserError(f"quant.kv={kv!r}: accuracy with a quantized KV cache is not measured "
                        "yet; allowed: none")
    tok = loaded.tokenizer
    if tok is None:
        raise UserError(f"model {loaded.source!r} has no tokenizer: perplexity needs one to "
                        "read the evaluation text (a GGUF file or an HF directory with "
                        "tokenizer.json)")
    start = time.perf_counter()
    ids = token_ids(tok, "test", plan.tokens)
    ppl = perplexity(loaded.model, ids, window=plan.window)
    continuations = None
    if with_continuations:
        prompts = eval_prompts(tok, plan.num_prompts)
        continuations = greedy_continuations(loaded.model, prompts, plan.new_tokens)
    return ModelFigures(ppl, continuations, time.perf_counter() - start)


def compare(candidate: ModelFigures, reference: ModelFigures | None,
            plan: EvalPlan) -> Accuracy:
    """The candidate's accuracy beside the reference's figures (None: perplexity only)."""
    agreement = change = ref_ppl = None
    seconds = candidate.seconds
    if reference is not None:
        ref_ppl = reference.perplexity
        change = candidate.perplexity / ref_ppl - 1.0
        seconds += reference.seconds
        if candidate.continuations is not None and reference.continuations is not None:
            agreement = greedy_agreement(candidate.continuations, reference.continuations,
                                         plan.new_tokens)
    return Accuracy(
        perplexity=candidate.perplexity, reference_perplexity=ref_ppl,
        perplexity_change=change, greedy_agreement=agreement, tokens=plan.tokens,
        window=plan.window,
        agreement_prompts=plan.num_prompts if agreement is not None else 0,
        agreement_tokens=plan.new_tokens if agreement is not None else 0,
        text_id=text_id("test"), seconds=seconds)
