"""Accuracy of a (quantized, pruned) model against its unquantized self of the same dtype.

`infbench eval` and every quantized point of `infbench run` call this: the candidate's
perplexity on the held-out test split of the evaluation text (`model/eval_text.py`) and
its free-running greedy continuations of fixed prompts, beside the reference model's
(the same source and dtype without `model.quant` / `model.prune`).  The measures
themselves are in `model/evaluate.py`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from infbench.core.errors import UserError
from infbench.engine.backend import get_ops
from infbench.engine.kv_cache import kv_quant_refusal
from infbench.model.eval_text import text_id
from infbench.model.evaluate import (
    AGREEMENT_POSITIONS,
    NUM_PROMPTS,
    eval_prompts,
    greedy_agreement,
    greedy_continuations,
    perplexity,
    token_ids,
)
from infbench.model.linear import use_cpu_linears
from infbench.model.loader import LoadedModel
from infbench.scenario.point import ScenarioPoint

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


def use_backend(loaded: LoadedModel, backend: str) -> str:
    """Run the model's layers through the engine's kernels of `backend` (auto | cpu | torch |
    triton), as `Engine` binds them, so accuracy is measured on the products the engine
    computes (on a CPU: the C++ float and int8/int4 GEMVs); returns the resolved name."""
    device = next(loaded.model.parameters()).device
    ops = get_ops(backend, device)
    if device.type == "cpu":
        use_cpu_linears(loaded.model, ops.name)
    loaded.model.set_ops(ops)
    return ops.name


def model_figures(loaded: LoadedModel, plan: EvalPlan, with_continuations: bool,
                  kv: str = "none") -> ModelFigures:
    """Perplexity (and the greedy continuations) of one loaded model; kv: its KV cache's
    quantization (none | int8 | fp8)."""
    reason = kv_quant_refusal(kv, next(loaded.model.parameters()).device, loaded.config)
    if reason is not None:
        raise UserError(f"quant.kv={kv!r}: {reason}")
    tok = loaded.tokenizer
    if tok is None:
        raise UserError(f"model {loaded.source!r} has no tokenizer: perplexity needs one to "
                        "read the evaluation text (a GGUF file or an HF directory with "
                        "tokenizer.json)")
    start = time.perf_counter()
    ids = token_ids(tok, "test", plan.tokens)
    ppl = perplexity(loaded.model, ids, window=plan.window, kv=kv)
    continuations = None
    if with_continuations:
        prompts = eval_prompts(tok, plan.num_prompts)
        continuations = greedy_continuations(loaded.model, prompts, plan.new_tokens, kv=kv)
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


# ---- run points ------------------------------------------------------------------------
def point_plan(point: ScenarioPoint, loaded: LoadedModel) -> EvalPlan | None:
    """What a run point measures for its result's `accuracy`, or None.

    A point with model.quant (weights or kv) or model.prune measures DEFAULT_EVAL_TOKENS
    unless measure.eval_tokens says otherwise; a plain point only when it is set.  A model
    without a tokenizer cannot read the text: a note when accuracy was implied, an error
    (before anything is timed) when measure.eval_tokens asked for it.
    """
    tokens = point.measure.eval_tokens
    if tokens is None and not is_modified(point):
        return None
    if loaded.tokenizer is None:
        why = (f"model {loaded.source!r} has no tokenizer to read the evaluation text "
               "(a GGUF file or an HF directory with tokenizer.json has one)")
        if tokens is not None:
            raise UserError(f"{point.source}: measure.eval_tokens: {why}")
        print(f"note: {point.name} point {point.index} ({point.label}): accuracy not measured: "
              f"{why}", file=sys.stderr)
        return None
    return EvalPlan(tokens=tokens or DEFAULT_EVAL_TOKENS)


def is_modified(point: ScenarioPoint) -> bool:
    """Whether the point's model differs from its checkpoint: quantized or pruned."""
    quant = point.quant_config()
    prune = point.prune_config()
    return quant.weights != "none" or quant.kv != "none" or prune.active


def point_accuracy(point: ScenarioPoint, loaded: LoadedModel, plan: EvalPlan, key: str,
                   load_reference: Callable[[], LoadedModel], backend: str,
                   memo: dict[str, ModelFigures]) -> Accuracy:
    """The point's accuracy; the reference is the same source and dtype without quant and
    prune (`load_reference`), loaded only when `memo` lacks its figures and run on the
    engine's `backend` as the point's model is.  `key` names the point's model in `memo`
    (the reference is named by its source, shape, dtype, device, weights, seed and
    backend), so a sweep measures each model once."""
    modified = is_modified(point)
    kv = point.quant_config().kv
    cand_key = repr((key, kv, backend, plan))
    if cand_key not in memo:
        memo[cand_key] = model_figures(loaded, plan, with_continuations=modified, kv=kv)
    reference = None
    if modified:
        m, device = point.model, next(loaded.model.parameters()).device
        assert m is not None  # an engine point has a model section
        ref_key = repr(("reference", sorted(point.model_source().items()), m.overrides,
                        m.attention, point.dtype, str(device), m.weights,
                        point.workload.seed, backend, plan))
        if ref_key not in memo:
            ref = load_reference()
            use_backend(ref, backend)
            memo[ref_key] = model_figures(ref, plan, with_continuations=True)
        reference = memo[ref_key]
    return compare(memo[cand_key], reference, plan)
