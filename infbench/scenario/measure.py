"""The scenario's `measure:` (with `measure.slo`) and `gate:` sections.

Each is declared once, here, and is also the point's config: `ScenarioPoint.measure` and
`.gate` hold the validated, frozen section (measure/goodput.py reads `SloSection`).
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

    @field_validator("percentiles")
    @classmethod
    def _distinct_percentiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        keys = [percentile_key(q) for q in value]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"each percentile once; repeated: {', '.join(twice)}")
        return tuple(float(q) for q in value)


class GateSection(Section):
    metric: str = "output_tokens_per_s"
    baseline: str | None = None
    """Result file (JSON) to compare with."""
    max_regression: Annotated[float, BeforeValidator(parse_fraction)] = 0.05
    """Largest tolerated regression as a fraction (0.05) or a percentage string ("5%")."""
    normalize: NormalizeMode = "none"

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
