"""A run's MoE routing statistics from its StepRecords (`metrics.moe` of a result).

Measured: the routed experts each step touched (summed over the MoE layers) and the bytes
of their weights; analytic: the same under the uniform routing the roofline assumes.
`expert_bytes_error_pct` is how far the measured expert bytes are from the roofline's
(negative: routing concentrated on fewer experts than uniform routing would touch).
Decode steps (no prefill tokens) are also summarized apart: with few tokens per step they
are where routing skew changes the bytes most.
"""

from __future__ import annotations

from typing import Any

from infbench.engine.records import MoEStep, StepRecord


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _error_pct(measured: float, expected: float) -> float | None:
    return (measured - expected) / expected * 100 if expected else None


def _summary(moes: list[MoEStep]) -> dict[str, Any]:
    measured = sum(m.expert_bytes for m in moes)
    expected = sum(m.expected_bytes for m in moes)
    return {
        "steps": len(moes),
        "experts_touched_per_step": _mean([m.experts_touched for m in moes]),
        "expected_experts_per_step": _mean([m.expected_experts for m in moes]),
        "expert_bytes": measured,
        "expected_expert_bytes": expected,
        "expert_bytes_error_pct": _error_pct(measured, expected),
    }


def routing_metrics(steps: list[StepRecord]) -> dict[str, Any] | None:
    """`metrics.moe` of one repeat; None for a model without MoE layers."""
    moes = [s.moe for s in steps if s.moe is not None and s.moe.num_tokens]
    if not moes:
        return None
    decode = [s.moe for s in steps if s.moe is not None and s.moe.num_tokens
              and s.num_prefill_tokens == 0]
    return {
        **_summary(moes),
        "max_over_mean": _mean([m.max_over_mean for m in moes]),
        "cv": _mean([m.cv for m in moes]),
        "decode": _summary(decode) if decode else None,
    }
