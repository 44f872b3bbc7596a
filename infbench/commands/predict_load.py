"""`infbench predict SCENARIO`, second table: every point predicted under its load.

The numbers are the points' `prediction.metrics` (measure/simulation.py: the engine's
scheduler over priced steps), the same keys `run` measures; the SLO max rate of a rate
sweep is `results.goodput`'s walk over them, exactly as `run` and `report` compute it from
measured points.  Multi-turn sessions points add the by-turn table and the sessions line
that `report` prints for a measured sessions run (results/sessions.py), of the prediction.
"""

from __future__ import annotations

from typing import Any

from infbench.measure.prediction import PointPrice


def _ms(stats: dict[str, Any] | None, key: str) -> str:
    value = (stats or {}).get(key)
    if value is None:
        return "-"
    ms = value * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def as_results(points: list[Any], prices: list[PointPrice]) -> list[dict[str, Any]]:
    """Result-shaped dicts of the simulated points (`metrics` the predicted ones), for the
    readers of finished results (`results.goodput`)."""
    out = []
    for point, priced in zip(points, prices, strict=True):
        if priced.metrics is None:
            continue
        out.append({"name": point.name, "label": point.label, "scenario": point.to_dict(),
                    "metrics": priced.metrics})
    return out


def print_under_load(points: list[Any], prices: list[PointPrice]) -> None:
    from rich.console import Console
    from rich.table import Table

    from infbench.results.goodput import max_rate_line, max_rate_summaries, rate_text
    from infbench.results.sessions import by_turn_rows, by_turn_table, session_lines

    console = Console(width=max(Console().width, 160))
    table = Table(title="Predicted under load: the engine's scheduler over priced steps "
                        "(ms; p50 / p90)",
                  caption="simulated: each request's tokens as the scheduler serves them, "
                          "metrics as `run` computes them (docs/predictions-under-load.md)")
    cols = ["point", "kind", "rate", "requests", "TTFT", "TPOT", "ITL", "E2E", "out tok/s",
            "goodput req/s", "within SLO %"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("point", "kind") else "right",
                         overflow="fold" if col == "point" else "ellipsis")
    shown = False
    for point, priced in zip(points, prices, strict=True):
        m = priced.metrics
        if m is None:
            continue
        shown = True
        w = point.workload

        def pair(name: str, m: dict[str, Any] = m) -> str:
            return f"{_ms(m.get(name), 'p50')} / {_ms(m.get(name), 'p90')}"

        attained = m.get("slo_attainment")
        goodput = m.get("goodput_requests_per_s")
        table.add_row(point.label, w.kind if w.dataset is None else f"{w.kind} (dataset)",
                      rate_text(w.rate) if w.kind in ("poisson", "sessions") else "-",
                      str(m.get("num_requests")), pair("ttft_s"), pair("tpot_s"),
                      pair("itl_s"), pair("e2e_s"), f"{m.get('output_tokens_per_s', 0):,.1f}",
                      "-" if goodput is None else f"{goodput:.3g}",
                      "-" if attained is None else f"{attained * 100:.1f}")
    if shown:
        console.print(table)
    results = as_results(points, prices)
    turns = by_turn_rows(results)  # kind sessions: latency by turn index, as `report`'s
    if turns:
        console.print(by_turn_table(turns, "Predicted sessions by turn (tokens: means; "
                                           "latencies in ms)"))
    for line in session_lines(results):
        console.print(f"predicted {line}", highlight=False)
    notes: dict[str, list[str]] = {}
    for point, priced in zip(points, prices, strict=True):
        if priced.simulation_note:
            notes.setdefault(priced.simulation_note, []).append(point.label)
    for text, labels in notes.items():
        where = labels[0] if len(labels) == 1 else f"{len(labels)} points"
        console.print(f"note: {where}: {text}", highlight=False)
    for summary in max_rate_summaries(results):
        console.print(f"predicted {max_rate_line(summary)}", highlight=False)
