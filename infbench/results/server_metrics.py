"""What `infbench report` shows of a client run's server metrics (`telemetry.server_metrics`).

`infbench run` of a `target:` point scrapes the server's Prometheus /metrics while the
repeats run (client/server_metrics.py) and stores the series and their summary; this module
only reads that summary: one row per point that has one (the table under the per-point
table), the `server_*` columns of `report --json / --markdown / --csv`, and a line for each
target that had no metrics.  No torch, no HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

# summary keys, in the table's order (client/server_metrics.summarize writes them)
SUMMARY_KEYS = ("kv_usage_mean", "kv_usage_max", "running_mean", "running_max",
                "waiting_mean", "waiting_max", "preemptions", "prefix_cache_hit_rate")


def server_metrics(result: dict[str, Any]) -> dict[str, Any] | None:
    """The result's `telemetry.server_metrics`, or None (an engine run, an older client run,
    a run with `target.metrics: false`)."""
    section = (result.get("telemetry") or {}).get("server_metrics")
    return section if isinstance(section, dict) else None


def has_server_metrics(results: Sequence[dict[str, Any]]) -> bool:
    return any((server_metrics(r) or {}).get("summary") for r in results)


def server_columns(result: dict[str, Any]) -> dict[str, Any]:
    """The `server_*` columns of a report row (None where the point has no summary)."""
    section = server_metrics(result) or {}
    summary = section.get("summary") or {}
    cols: dict[str, Any] = {"server_metrics_source": section.get("source")}
    cols.update({f"server_{key}": summary.get(key) for key in SUMMARY_KEYS})
    return cols


def server_metrics_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point with a summary, in the results' order."""
    rows = []
    for r in results:
        section = server_metrics(r) or {}
        summary = section.get("summary")
        if not summary:
            continue
        name, label = r.get("name"), r.get("label")
        rows.append({"label": f"{name} {label}" if name and label else str(label or name),
                     "source": section.get("source"), "samples": summary.get("num_samples"),
                     **{key: summary.get(key) for key in SUMMARY_KEYS}})
    return rows


def missing_metrics_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per target URL that gave no metrics (the reason the run recorded)."""
    seen: dict[str, str] = {}
    for r in results:
        section = server_metrics(r) or {}
        if section.get("error") and section.get("url") not in seen:
            seen[str(section.get("url"))] = str(section["error"])
    return [f"server metrics: none from {url} ({why})" for url, why in seen.items()]


def _num(value: Any, digits: int, scale: float = 1.0) -> str:
    return "-" if value is None else f"{float(value) * scale:,.{digits}f}"


def server_metrics_table(rows: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="server metrics, scraped during the repeats (mean / max)")
    cols = ("point", "server", "samples", "KV %", "running", "waiting", "preempt",
            "prefix hit %")
    for i, col in enumerate(cols):
        table.add_column(col, justify="left" if i < 2 else "right", overflow="fold")
    for r in rows:
        table.add_row(
            r["label"], str(r["source"]), _num(r["samples"], 0),
            f"{_num(r['kv_usage_mean'], 0, 100)} / {_num(r['kv_usage_max'], 0, 100)}",
            f"{_num(r['running_mean'], 1)} / {_num(r['running_max'], 0)}",
            f"{_num(r['waiting_mean'], 1)} / {_num(r['waiting_max'], 0)}",
            _num(r["preemptions"], 0), _num(r["prefix_cache_hit_rate"], 1, 100))
    return table
