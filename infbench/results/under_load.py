"""Measured vs predicted under load: a result's `metrics` beside its `prediction.metrics`.

Every result `run` writes holds `prediction.metrics`, the point simulated under its load
(measure/simulation.py), in the same shape as the measured `metrics`, so the comparison is
name by name: TTFT, TPOT and ITL at p50 and p90, output tokens/s and, for a point run with
`measure.slo`, goodput and the share of requests within the SLO.  error % is
(predicted - measured) / measured, as in `report`'s main table.  Over a rate sweep the
predicted SLO max rate is the same walk (`results.goodput.max_rate_summaries`) over the
predicted metrics.  Reads finished results only (no torch).
"""

from __future__ import annotations

from typing import Any

from infbench.results.report import _compact, error_pct, short_label

# (column, metric name, scale to the column's unit)
UNDER_LOAD = (
    ("ttft_p50_ms", "ttft_s.p50", 1e3), ("ttft_p90_ms", "ttft_s.p90", 1e3),
    ("tpot_p50_ms", "tpot_s.p50", 1e3), ("tpot_p90_ms", "tpot_s.p90", 1e3),
    ("itl_p50_ms", "itl_s.p50", 1e3), ("itl_p90_ms", "itl_s.p90", 1e3),
    ("output_tok_s", "output_tokens_per_s", 1.0),
    ("goodput_req_s", "goodput_requests_per_s", 1.0), ("slo_attainment", "slo_attainment", 1.0),
)


def _at(tree: Any, path: str) -> float | None:
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def predicted_metrics(result: dict[str, Any]) -> dict[str, Any] | None:
    metrics = (result.get("prediction") or {}).get("metrics")
    return metrics if isinstance(metrics, dict) else None


def under_load_row(result: dict[str, Any]) -> dict[str, Any] | None:
    """measured / predicted / error % per column, or None without a simulated prediction."""
    predicted = predicted_metrics(result)
    if predicted is None:
        return None
    measured = result.get("metrics") or {}
    row: dict[str, Any] = {"label": result.get("label"), "name": result.get("name")}
    for column, name, scale in UNDER_LOAD:
        m, p = _at(measured, name), _at(predicted, name)
        m = None if m is None else m * scale
        p = None if p is None else p * scale
        row[f"{column}_measured"], row[f"{column}_predicted"] = m, p
        row[f"{column}_error_pct"] = error_pct(p, m)
    return row


def under_load_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in map(under_load_row, results) if row is not None]


def predicted_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results with their predicted metrics in place of the measured ones (for the
    readers of `metrics`, such as the SLO max rate)."""
    return [{**r, "metrics": predicted_metrics(r)} for r in results
            if predicted_metrics(r) is not None]


def under_load_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="under load: measured / predicted (the engine's scheduler over priced "
                        "steps), error %")
    table.add_column("point", overflow="fold")
    columns = [c for c, _, _ in UNDER_LOAD if c != "slo_attainment"
               and any(r[f"{c}_measured"] is not None for r in rows)]
    titles = {"ttft_p50_ms": "TTFT p50 ms", "ttft_p90_ms": "TTFT p90 ms",
              "tpot_p50_ms": "TPOT p50 ms", "tpot_p90_ms": "TPOT p90 ms",
              "itl_p50_ms": "ITL p50 ms", "itl_p90_ms": "ITL p90 ms",
              "output_tok_s": "output tok/s", "goodput_req_s": "goodput req/s"}
    for column in columns:
        table.add_column(titles[column], justify="right")
    for row in rows:
        cells = []
        for column in columns:
            text = f"{_compact(row[f'{column}_measured'])} / {_compact(row[f'{column}_predicted'])}"
            error = row[f"{column}_error_pct"]
            cells.append(text if error is None else f"{text} {error:+.0f}%")
        table.add_row(short_label(row["label"]), *cells)
    return table
