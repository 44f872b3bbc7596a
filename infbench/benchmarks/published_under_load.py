"""The under-load table of docs/fidelity.md: published serving runs beside the simulation.

    python -m infbench.benchmarks.published_under_load

prints, as Markdown, every row of `infbench/data/published/under_load.yaml` priced by the
simulation (`measure.published_load`): each measured metric beside the prediction at the
datasheet peaks and at the fractions `predict --efficiency ENGINE` fits for the row's
engine, the ratio of each, the medians per metric, the gaps and the sources.
docs/fidelity.md holds this output between its `under-load-tables` markers, and
tests/roofline/test_published_under_load.py checks that it is what this prints at the
commit.
"""

from __future__ import annotations

import statistics
import sys
from functools import cache

from infbench.benchmarks.published import print_table, sources_lines
from infbench.measure.efficiency import engine_efficiency, fittable_engines
from infbench.measure.prediction import Efficiency
from infbench.measure.published_load import (
    LOAD_METRICS,
    TIME_METRICS,
    LoadPrice,
    UnderLoadRow,
    load_rows,
    price_under_load,
)

START = "<!-- under-load-tables:start -->"
END = "<!-- under-load-tables:end -->"
HEADS = {"ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "itl_ms": "ITL ms", "e2e_ms": "E2E ms",
         "output_tokens_per_s": "output tok/s"}


@cache
def fitted(engine: str) -> Efficiency | None:
    """The engine's `--efficiency` fractions, or None where measurements.yaml has no fit."""
    return engine_efficiency(engine) if engine in fittable_engines() else None


@cache
def prices(row: UnderLoadRow) -> tuple[LoadPrice, LoadPrice | None]:
    """The row at the datasheet peaks, and at its engine's fitted fractions (None: no fit).
    Cached: the test and the table price each row once."""
    efficiency = fitted(row.engine)
    derated = None if efficiency is None else price_under_load(row, efficiency)
    return price_under_load(row), derated


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(price: LoadPrice | None, metric: str) -> str:
    if price is None:
        return "no fit"
    if metric not in dict(price.row.measured):
        return "-"
    return f"{_num(price.value(metric))} ({price.ratio(metric):.2f})"


def rows_table(rows: list[UnderLoadRow]) -> list[str]:
    """One line per row: each metric measured, predicted (ratio), and at the fit."""
    cols = ["row", "engine", "model", "setup", "load", "requests priced", "metric",
            "measured",
            "predicted (ratio)", "at the engine's fit (ratio)"]
    out = [_line(cols), _line(["---"] * len(cols))]
    for row in rows:
        raw, derated = prices(row)
        run = (f"{row.requests} (the run's: not stated)" if row.num_requests is None
               else f"{row.requests} of {row.num_requests}")
        for i, (metric, value) in enumerate(row.measured):
            gap = " (gap)" if metric in dict(row.gap) else ""
            stat = f" {row.statistic}" if metric in TIME_METRICS else ""
            head = ([row.id, row.engine, row.published_model or row.model, row.setup,
                     row.load, run] if i == 0 else [""] * 6)
            out.append(_line([*head, HEADS[metric] + stat, _num(value),
                              _cell(raw, metric) + gap, _cell(derated, metric)]))
    return out


def medians_table(rows: list[UnderLoadRow]) -> list[str]:
    """Per metric: how many measured, how many bounded, the median ratio raw and at the fit."""
    cols = ["metric", "measured", "bounded (ratio >= 1)", "median ratio", "range",
            "median ratio at the fit"]
    out = [_line(cols), _line(["---"] * len(cols))]
    for metric in LOAD_METRICS:
        raw = [prices(r)[0].ratio(metric) for r in rows if metric in dict(r.measured)]
        fit = [p.ratio(metric) for r in rows if metric in dict(r.measured)
               for p in prices(r)[1:] if p is not None]
        if not raw:
            continue
        out.append(_line([HEADS[metric], str(len(raw)), str(sum(x >= 1.0 for x in raw)),
                          f"{statistics.median(raw):.2f}", f"{min(raw):.2f}-{max(raw):.2f}",
                          f"{statistics.median(fit):.2f} ({len(fit)} rows)" if fit else "-"]))
    return out


def render() -> str:
    """The Markdown docs/fidelity.md holds between its under-load markers."""
    rows = load_rows()
    metrics = [(r, m) for r in rows for m, _ in r.measured]
    bounded = sum(prices(r)[0].is_bound(m) for r, m in metrics)
    fits = ", ".join(f"{e} {eff.bandwidth:.1%} of the bandwidth, {eff.compute:.1%} of the "
                     f"compute" for e in sorted({r.engine for r in rows})
                     if (eff := fitted(e)) is not None)
    lines = [START, "", f"{len(rows)} published runs, {len(metrics)} measured metrics: the "
             f"simulation at the datasheet peaks bounds {bounded} of them. The fitted "
             f"fractions: {fits}.", ""]
    lines += rows_table(rows)
    lines += ["", "Per metric:", ""]
    lines += medians_table(rows)
    lines += ["", "Gaps:", ""]
    lines += [f"- `{r.id}` {HEADS[m]}: {why}" for r in rows for m, why in r.gap] or ["- none"]
    lines += ["", "Sources:", ""]
    lines += sources_lines(rows)
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return print_table(argv, render)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
