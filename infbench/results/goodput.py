"""Goodput over a request-rate sweep: per-point rows and the highest rate meeting the SLOs.

Reads finished results only (no torch): each point run with `measure.slo` carries
`metrics.goodput_requests_per_s` and `metrics.slo_attainment` (measure/goodput.py).  Points
are grouped by what their sweep varies besides `rate` (one group for a plain rate sweep);
within a group, the *SLO max rate* is the highest `workload.rate` at which at least
`measure.slo.target` (0.9 by default) of the requests met every objective, with every lower
rate of the sweep meeting it too: the rates are walked upwards and the walk stops at the
first rate that misses, so a noisy higher rate that happens to pass again (or a client cap
that hides queueing) is not reported as sustainable.  None when the lowest rate misses.  A
rate of inf (every request at t=0) is the highest of all.  `report`, `run` and `plots` show it.
"""

from __future__ import annotations

import math
from typing import Any

from infbench.results.accessor import metric
from infbench.results.report import short_label


def rate_value(value: Any) -> float | None:
    """A stored workload.rate: a number, "inf" (written for math.inf) or None."""
    if value == "inf":
        return math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def rate_text(rate: float | None) -> str:
    """2 -> '2', 0.5 -> '0.5', inf -> 'inf', None -> '-'."""
    if rate is None:
        return "-"
    return "inf" if math.isinf(rate) else f"{rate:g}"


def json_rate(rate: float | None) -> float | str | None:
    """A rate for strict JSON: inf becomes the string "inf", as in the scenario echo."""
    return "inf" if rate is not None and math.isinf(rate) else rate


def _scenario(result: dict[str, Any], section: str) -> dict[str, Any]:
    value = (result.get("scenario") or {}).get(section)
    return value if isinstance(value, dict) else {}


def slo_of(result: dict[str, Any]) -> dict[str, Any] | None:
    """The point's measure.slo (objectives in ms and target), or None."""
    slo = _scenario(result, "measure").get("slo")
    return slo if isinstance(slo, dict) else None


def group_label(result: dict[str, Any]) -> str:
    """What the point's sweep varies besides the rate (`default` for a plain rate sweep)."""
    swept = result.get("scenario", {}).get("swept") or {}
    rest = [f"{k}={v}" for k, v in swept.items() if k != "rate"]
    return short_label(",".join(rest)) if rest else "default"


def goodput_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point run with measure.slo: rate, goodput, attainment, latencies (ms)."""
    rows = []
    for r in results:
        slo = slo_of(r)
        if slo is None:
            continue

        def ms(name: str, result: dict[str, Any] = r) -> float | None:
            value = metric(result, name)
            return None if value is None else value * 1e3

        rows.append({
            "name": r.get("name"), "label": r.get("label"), "group": group_label(r),
            "rate": rate_value(_scenario(r, "workload").get("rate")),
            "target": float(slo.get("target", 0.9)),
            "slo": {k: slo.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")
                    if slo.get(k) is not None},
            "goodput_requests_per_s": metric(r, "goodput_requests_per_s"),
            "slo_attainment": metric(r, "slo_attainment"),
            "requests_per_s": metric(r, "requests_per_s"),
            "ttft_p50_ms": ms("ttft_s.p50"), "ttft_p99_ms": ms("ttft_s.p99"),
            "tpot_p50_ms": ms("tpot_s.p50"), "tpot_p99_ms": ms("tpot_s.p99"),
            "e2e_p50_ms": ms("e2e_s.p50"),
        })
    return rows


def max_rate_summaries(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, group) with rated points: the SLO max rate and the rates tried."""
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for row in goodput_rows(results):
        if row["rate"] is not None:
            groups.setdefault((row["name"], row["group"]), []).append(row)
    out = []
    for (name, group), rows in groups.items():
        rows.sort(key=lambda row: row["rate"])
        target = rows[0]["target"]
        best = None
        for row in rows:  # upwards, up to the first rate that misses the target
            if row["slo_attainment"] is None or row["slo_attainment"] < target:
                break
            best = row
        out.append({
            "name": name, "group": group, "target": target, "slo": rows[0]["slo"],
            "rates": [row["rate"] for row in rows],
            "max_rate": best["rate"] if best else None,
            "goodput_at_max_rate": best["goodput_requests_per_s"] if best else None,
        })
    return out


def max_rate_line(summary: dict[str, Any]) -> str:
    """`highest rate with >= 90% of requests within SLO (ttft <= 500 ms): 4 req/s`."""
    objectives = ", ".join(f"{k.removesuffix('_ms')} <= {v:g} ms"
                           for k, v in summary["slo"].items())
    where = "" if summary["group"] == "default" else f" [{summary['group']}]"
    tried = ", ".join(rate_text(r) for r in summary["rates"])
    if summary["max_rate"] is None:
        value = f"none of the rates tried ({tried} req/s)"
    else:
        value = (f"{rate_text(summary['max_rate'])} req/s (goodput "
                 f"{summary['goodput_at_max_rate']:.3g} req/s; rates tried: {tried})")
    return (f"SLO max rate{where}: highest rate with >= {summary['target']:.0%} of requests "
            f"within SLO ({objectives}): {value}")


def goodput_table(rows: list[dict[str, Any]]) -> Any:
    """A rich Table of the goodput rows (rich imported here, as report does)."""
    from rich.table import Table

    from infbench.results.report import _fmt

    table = Table(title="goodput: requests meeting every SLO")
    table.add_column("point", overflow="fold")
    for col in ("rate req/s", "goodput req/s", "within SLO %", "TTFT p99 ms", "TPOT p99 ms",
                "E2E p50 ms"):
        table.add_column(col, justify="right")
    for row in rows:
        attained = row["slo_attainment"]
        table.add_row(short_label(row["label"]), rate_text(row["rate"]),
                      _fmt(row["goodput_requests_per_s"], 3),
                      "-" if attained is None else f"{attained * 100:.1f}",
                      _fmt(row["ttft_p99_ms"]), _fmt(row["tpot_p99_ms"]), _fmt(row["e2e_p50_ms"]))
    return table
