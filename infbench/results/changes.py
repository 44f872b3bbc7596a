"""Every headline metric's change between two runs, for the comparison report.

`infbench compare` gates one metric (`gate.compare_many`); a person reading the comparison
also wants to see what else moved.  `metric_changes` runs the same comparison for each of
`CHANGE_METRICS` that both sides carry (points matched as the gate matches them, values
the median of the repeats as the gate reads them), and adds each side's range over its
repeats, so a change inside the noise reads as such.  A metric missing on either side is
left out and named in the notes; nothing here decides the exit code.
"""

from __future__ import annotations

from typing import Any

from infbench.core.errors import ResultSchemaError, UserError
from infbench.results.gate import GateResult, compare_many, gated_values

CHANGE_METRICS = ("output_tokens_per_s", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
                  "tpot_s.p99", "itl_s.p99", "e2e_s.p50", "decode.mbu", "peak_memory_bytes",
                  "goodput_requests_per_s", "accuracy.perplexity")


def _range(values: list[float]) -> tuple[float, float] | None:
    return (min(values), max(values)) if len(values) >= 2 else None


def metric_changes(baselines: list[dict[str, Any]], news: list[dict[str, Any]],
                   gate: GateResult,
                   metrics: tuple[str, ...] = CHANGE_METRICS) -> tuple[list[dict[str, Any]],
                                                                       list[str]]:
    """(rows, notes): the gate's rows first, then one row per point for each other metric.

    Each row: point, metric, gated, baseline, new, change_pct, better_pct (the change with
    the sign flipped for lower-is-better metrics, so up is better), status, source (where
    the values came from), baseline_range / new_range ((min, max) over the repeats, None
    each when there is one value) and noise_pct (both sides' ranges added, relative to the
    baseline)."""
    by_key = {(r.get("name"), r.get("label")): r for r in baselines}
    new_by_key = {(r.get("name"), r.get("label")): r for r in news}
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    names = [gate.metric] + [m for m in metrics if m != gate.metric]
    for name in names:
        if name == gate.metric:
            result = gate
        else:
            try:
                result = compare_many(baselines, news, metric=name,
                                      max_regression=gate.max_regression)
            except (ResultSchemaError, UserError):
                skipped.append(name)
                continue
        for row in result.rows:
            ranges = _side_ranges(by_key, new_by_key, row.point, name, result.normalize)
            noise = [hi - lo for lo, hi in ranges if lo is not None and hi is not None]
            rows.append({
                "point": row.point, "metric": row.metric, "gated": name == gate.metric,
                "baseline": row.baseline, "new": row.new, "change_pct": row.change_pct,
                "better_pct": -row.change_pct if row.is_lower_better else row.change_pct,
                "status": row.status, "source": row.source,
                "baseline_range": ranges[0], "new_range": ranges[1],
                "noise_pct": (sum(noise) / abs(row.baseline) * 100) if noise and row.baseline
                else None})
    notes = ([f"not in both runs, not compared: {', '.join(skipped)}"] if skipped else [])
    return rows, notes


def _side_ranges(baselines: dict[Any, dict[str, Any]], news: dict[Any, dict[str, Any]],
                 point: str, metric: str, normalize: str
                 ) -> list[tuple[float | None, float | None]]:
    """(min, max) over the repeats of the baseline and the new point labelled `point`."""
    out: list[tuple[float | None, float | None]] = []
    for side in (baselines, news):
        found = [r for (_, label), r in side.items() if str(label or r.get("name")) == point]
        span: tuple[float | None, float | None] = (None, None)
        if len(found) == 1:
            try:
                values = gated_values(found[0], metric, normalize)[1]
            except (ResultSchemaError, UserError):
                values = []
            span = _range(values) or (None, None)
        out.append(span)
    return out
