"""The scenario's `measure:` (with `measure.slo` and `measure.window`) and `gate:` sections.

Each is declared once, here, and is also the point's config: `ScenarioPoint.measure` and
`.gate` hold the validated, frozen section (measure/goodput.py reads `SloSection`,
measure/windows.py `WindowSection` and `measure.duration_s`; docs/windows.md).  The checks
between `measure.duration_s`, `measure.window` and the workload run in
scenario/document.py, where both sections are known.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from infbench.core.metric_names import (
    DEFAULT_PERCENTILES,
    GATE_METRICS,
    LATENCY_METRICS,
    SCALAR_METRICS,
    is_gate_metric,
    percentile_key,
)
from infbench.scenario.values import (
    MAX_VALUE,
    NonNegFloat,
    NonNegInt,
    Percentile,
    PosFloat,
    PosInt,
    Section,
    StrictBool,
    parse_fraction,
)

NormalizeMode = Literal["none", "mbu", "roofline_fraction", "reference", "torch_reference"]
NORMALIZE_MODES: tuple[str, ...] = typing.get_args(NormalizeMode)


class SloSection(Section):
    """measure.slo: latency objectives in milliseconds (unset: not an objective)."""

    ttft_ms: PosFloat | None = None
    """Time to first token, milliseconds."""
    tpot_ms: PosFloat | None = None
    """Time per output token, (E2E - TTFT) / (output tokens - 1), milliseconds."""
    e2e_ms: PosFloat | None = None
    """End-to-end latency, milliseconds."""
    target: Annotated[float, Field(gt=0, le=1, strict=True, allow_inf_nan=False)] = 0.9
    """A rate sweep reports the highest rate at which at least this fraction meets them."""

    @model_validator(mode="after")
    def _some_objective(self) -> SloSection:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("give at least one of ttft_ms, tpot_ms, e2e_ms")
        return self


class WindowSection(Section):
    """measure.window: the part of each repeat that the windowed metrics (`metrics.window`)
    summarize; every given bound applies (docs/windows.md)."""

    warmup_s: NonNegFloat = 0.0
    """Seconds from the repeat's start left out (requests that arrived before, and tokens
    produced before)."""
    cooldown_s: NonNegFloat = 0.0
    """Seconds before the repeat's end (its last finished request) left out."""
    warmup_requests: NonNegInt = 0
    """The first N requests (in arrival order) left out of the window's latencies; the
    window starts no earlier than the first kept request's arrival."""
    cooldown_requests: NonNegInt = 0
    """The last N requests (in arrival order) left out; the window ends no later than the
    last kept request's finish."""
    steady_state: StrictBool = False
    """Only the time while the client's outstanding requests were at their target (the
    concurrency cap: workload.max_concurrency, or batch_size of kind static): from the first
    time they reach it to the last time they fall below it.  Without a cap (kind poisson or
    trace) the band around their median, up to the last arrival (docs/windows.md)."""

    @model_validator(mode="after")
    def _something_excluded(self) -> WindowSection:
        if not (self.warmup_s or self.cooldown_s or self.warmup_requests
                or self.cooldown_requests or self.steady_state):
            raise ValueError("give at least one of warmup_s, cooldown_s, warmup_requests, "
                             "cooldown_requests > 0 or steady_state: true (or remove "
                             "measure.window)")
        return self


class MeasureSection(Section):
    warmup: NonNegInt = 1
    repeats: PosInt = 3
    profile: Literal["none", "ncu"] = "none"
    percentiles: Annotated[tuple[Percentile, ...], Field(min_length=1, max_length=100)] = (
        DEFAULT_PERCENTILES)
    """Latency percentiles in (0, 100] reported next to the mean, keyed p50, p99.9."""
    torch_reference: StrictBool = False
    """Time a plain-torch forward of the same model shape between the repeats (the
    `torch_reference` gate; measure/torch_reference.py).  About doubles the run time."""
    eval_tokens: Annotated[int, Field(ge=2, le=MAX_VALUE, strict=True)] | None = None
    """Tokens of held-out text scored for the result's `accuracy` (perplexity, and greedy
    agreement with the unquantized model; docs/accuracy.md).  Unset: 2048 on a point with
    model.quant or model.prune, none on a plain point (set it to measure that one too)."""
    slo: SloSection | None = None
    """Service-level objectives: each request meeting every given one counts towards
    `goodput_requests_per_s` and `slo_attainment` (docs/goodput.md)."""
    duration_s: PosFloat | None = None
    """A time-based run: each repeat submits requests until this many seconds have passed
    (poisson: the arrivals drawn before it, at most workload.num_requests when set; static
    and capped offline: workload.num_requests is the most sent) and lets the ones in flight
    finish (docs/windows.md)."""
    window: WindowSection | None = None
    """Warm-up / cool-down exclusion and the steady-state window; the result's
    `metrics.window` holds the same metrics for that window (docs/windows.md)."""

    @field_validator("percentiles")
    @classmethod
    def _distinct_percentiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        keys = [percentile_key(q) for q in value]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"each percentile once; repeated: {', '.join(twice)}")
        return tuple(float(q) for q in value)


GateDecision = Literal["median", "confidence"]
GATE_DECISIONS: tuple[str, ...] = typing.get_args(GateDecision)


class GateSection(Section):
    metric: str = "output_tokens_per_s"
    baseline: str | None = None
    """Result file (JSON) to compare with."""
    max_regression: Annotated[float, BeforeValidator(parse_fraction)] = 0.05
    """Largest tolerated regression as a fraction (0.05) or a percentage string ("5%")."""
    normalize: NormalizeMode = "none"
    decision: GateDecision = "median"
    """median: a regression when the median of the new repeats is worse than the baseline's
    by more than max_regression; confidence: only when the whole t interval of the new
    repeats is (docs/windows.md#the-gate)."""
    confidence: Annotated[float, Field(gt=0, lt=1, strict=True, allow_inf_nan=False)] = 0.95
    """The level of the t intervals decision: confidence uses (0.95: 95%)."""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        head, dot, _ = value.partition(".")
        # Nested paths under other heads ("decode.mbu") come from the traffic accounting.
        is_nested = bool(dot) and head not in SCALAR_METRICS + LATENCY_METRICS
        if is_gate_metric(value) or is_nested:
            return value
        raise ValueError(f"unknown value {value!r}; allowed: {', '.join(GATE_METRICS)}, "
                         "another measure.percentiles key (ttft_s.p99.9), "
                         "or a dotted path into the metrics (decode.mbu)")
