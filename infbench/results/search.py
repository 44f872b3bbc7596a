"""What `infbench search` prints: the table of tried points and the one-line answer.

Both read the search summary only (the dict written to `search.json`, built by
measure/search.summary_doc); no torch.
"""

from __future__ import annotations

from typing import Any

UNITS = {"rate": "req/s", "concurrency": "in flight"}


def value_text(value: float | None, over: str) -> str:
    """4.5 -> '4.5', a concurrency 8.0 -> '8', None -> '-'."""
    if value is None:
        return "-"
    return f"{int(value)}" if over == "concurrency" else f"{value:g}"


def _objectives(summary: dict[str, Any]) -> str:
    return ", ".join(f"{k.removesuffix('_ms')} <= {v:g} ms"
                     for k, v in summary["slo"].items() if k.endswith("_ms") and v is not None)


def search_line(summary: dict[str, Any]) -> str:
    """`search: highest rate with >= 90% of requests within SLO (ttft <= 250 ms): 4.5 req/s
    (threshold in [4.5, 5) req/s, +11%; 9 points)`, or why there is no such value."""
    over, unit = summary["over"], UNITS[summary["over"]]
    status, value, fail = summary["status"], summary["value"], summary["bracket"][1]
    head = (f"search: highest {over} with >= {summary['target']:.0%} of requests within SLO "
            f"({_objectives(summary)})")
    points = f"{summary['num_points']} points"
    if status == "below_lo":
        return (f"{head}: none; lo {value_text(summary['lo'], over)} {unit} misses it "
                f"({points})")
    if status == "above_hi":
        return (f"{head}: at least hi {value_text(summary['hi'], over)} {unit}, where it still "
                f"holds (raise search.hi; {points})")
    if value is None:
        return f"{head}: none found before max_points ({points})"
    if fail is None:
        return (f"{head}: at least {value_text(value, over)} {unit}; no value tried failed "
                f"before max_points ({points})")
    rel = summary.get("relative_uncertainty")
    width = "" if rel is None else f", +{rel:.0%}"
    stopped = "" if status == "converged" else "; stopped at max_points, bracket not confirmed"
    return (f"{head}: {value_text(value, over)} {unit} (threshold in "
            f"[{value_text(value, over)}, {value_text(fail, over)}) {unit}{width}; "
            f"{points}{stopped})")


def search_table(summary: dict[str, Any]) -> Any:
    """A rich Table of the tries, in the order they ran (rich imported here, as report)."""
    from rich.table import Table

    from infbench.results.report import _fmt

    over = summary["over"]
    verdicts = {v["value"]: v["passed"] for v in summary["values"]}
    table = Table(title=f"search over {summary['key']}: points tried")
    heading = "rate req/s" if over == "rate" else "in flight"
    # "this try": the try alone against the target; "value": the median of the value's
    # tries.  The files are in search.json (the tries in order: <name>_000.json, ...).
    for col in ("#", "phase", heading, "within SLO %", "this try", "value", "goodput req/s",
                "TTFT p99 ms", "TPOT p99 ms"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for t in summary["tries"]:
        attained = t.get("attainment")
        table.add_row(str(t["index"]), t["phase"], value_text(t["value"], over),
                      "-" if attained is None else f"{attained * 100:.1f}",
                      "pass" if t["passed"] else "fail",
                      "pass" if verdicts.get(t["value"]) else "fail",
                      _fmt(t.get("goodput_requests_per_s"), 2), _fmt(t.get("ttft_p99_ms")),
                      _fmt(t.get("tpot_p99_ms")))
    return table
