"""Latency and goodput against the request rate, for a rate sweep run with `measure.slo`.

Two panels sharing the x axis (requested rate, req/s; a rate of inf is drawn one step
right of the highest finite rate and labelled `inf`):

- top: TTFT and TPOT (one colour each) at p50 (circles) and p99 (triangles) in ms, log
  scale, with each SLO objective as a dashed horizontal line of its metric's colour;
- bottom: goodput (req/s, left axis, squares) and the fraction of requests within the SLOs
  (right axis, 0..1, triangles) with the target as a dotted line and the SLO max rate
  marked.

Measured series are solid with filled markers; where the results hold `prediction.metrics`
(the simulation of the same requests, plots/predicted.py) each has its predicted twin,
dashed with hollow markers, and the predicted SLO max rate is a dashed vertical line.
One line per group (what the sweep varies besides the rate; results/goodput.py).  Returns
the plotted values, so tests check numbers rather than pixels; None (nothing written) when
no result has both a rate and an SLO.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from infbench.plots.measured import _run_colours, figure_caption
from infbench.plots.predicted import PREDICTED_DASH, plot_series, predicted_handle
from infbench.results.goodput import goodput_rows, max_rate_summaries, rate_text
from infbench.results.under_load import predicted_results

LATENCY_SERIES = (("ttft", "TTFT", "#0072B2"), ("tpot", "TPOT", "#D55E00"))
STAT_MARKERS = (("p50", "o"), ("p99", "^"))
# the per-point values a line carries, measured and (under "predicted") simulated
LINE_KEYS = tuple(f"{m}_{s}_ms" for m, _, _ in LATENCY_SERIES for s, _ in STAT_MARKERS) + (
    "goodput", "slo_attainment")
TEXT = {"title": "Latency and goodput vs request rate", "rate": "request rate (req/s)",
        "latency": "latency (ms)", "goodput": "goodput (req/s)", "attainment": "within SLO"}


def rate_axis(rates: list[float]) -> dict[str, Any]:
    """The shared x axis of a rate sweep: `x_of` (each rate's position: itself, and inf one
    typical step past the largest finite rate), the tick positions and their labels."""
    finite = sorted({r for r in rates if math.isfinite(r)})
    step = (finite[-1] - finite[0]) / max(len(finite) - 1, 1) if len(finite) > 1 else 1.0
    top = finite[-1] if finite else 0.0
    x_of = {r: (r if math.isfinite(r) else top + step) for r in rates}
    ticks = sorted(set(x_of.values()))
    return {"x_of": x_of, "ticks": ticks,
            "tick_text": [rate_text(next(r for r, x in x_of.items() if x == t)) for t in ticks]}


def _values(row: dict[str, Any] | None) -> dict[str, float | None]:
    """A goodput row's values under the line's keys (all None for no row)."""
    if row is None:
        return dict.fromkeys(LINE_KEYS)
    return {**{k: row[k] for k in LINE_KEYS[:-2]},
            "goodput": row["goodput_requests_per_s"], "slo_attainment": row["slo_attainment"]}


def goodput_rate_data(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the figure draws: one line per group (name, group, rates, x positions, TTFT/TPOT
    p50/p99 ms, goodput, slo_attainment, max_rate, and `predicted`: the same values from
    `prediction.metrics`, None where a point has none, with `predicted_max_rate`), the
    groups in order, the objectives and target, the x tick positions and labels, `x_of`
    (rate -> x) and `has_predicted`; None when no result has both a rate and an SLO."""
    pairs = []  # (measured row, predicted row or None), one per rated point with an SLO
    for r in results:
        rows = goodput_rows([r])
        if rows and rows[0]["rate"] is not None:
            predicted = goodput_rows(predicted_results([r]))
            pairs.append((rows[0], predicted[0] if predicted else None))
    if not pairs:
        return None
    summaries = {(m["name"], m["group"]): m for m in max_rate_summaries(results)}
    predicted_summaries = {(m["name"], m["group"]): m
                           for m in max_rate_summaries(predicted_results(results))}
    keys = list(dict.fromkeys((row["name"], row["group"]) for row, _ in pairs))
    axis = rate_axis([row["rate"] for row, _ in pairs])
    lines: list[dict[str, Any]] = []
    for key in keys:
        pts = sorted((p for p in pairs if (p[0]["name"], p[0]["group"]) == key),
                     key=lambda p: p[0]["rate"])
        rates = [row["rate"] for row, _ in pts]
        line: dict[str, Any] = {"name": key[0], "group": key[1], "rates": rates,
                                "x": [axis["x_of"][rate] for rate in rates]}
        measured = [_values(row) for row, _ in pts]
        predicted = [_values(p) for _, p in pts]
        for k in LINE_KEYS:
            line[k] = [v[k] for v in measured]
        line["predicted"] = {k: [v[k] for v in predicted] for k in LINE_KEYS}
        summary = summaries.get(key)
        line["max_rate"] = summary["max_rate"] if summary else None
        # the predicted walk only where every rate of the line was simulated: a gap
        # would let it step over a rate that might miss
        simulated = predicted_summaries.get(key)
        line["predicted_max_rate"] = (simulated["max_rate"] if simulated
                                      and simulated["rates"] == rates else None)
        lines.append(line)
    has_predicted = any(v is not None for line in lines
                        for values in line["predicted"].values() for v in values)
    first = pairs[0][0]
    return {"lines": lines, "keys": keys, "slo": first["slo"], "target": first["target"],
            "has_predicted": has_predicted, **axis}


def goodput_rate_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                        size: str = "column") -> dict[str, Any] | None:
    """The latency-and-goodput-versus-rate figure (see the module docstring)."""
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    data = goodput_rate_data(results)
    if data is None:
        return None
    lines, keys, slo = data["lines"], data["keys"], data["slo"]
    with figure_style(size):
        fig = new_figure(size)
        ax_lat, ax_good = fig.subplots(2, 1, sharex=True)
        ax_frac = ax_good.twinx()
        colours = dict(zip(keys, _run_colours(len(keys)), strict=True))
        for line in lines:
            key, xs = (line["name"], line["group"]), line["x"]
            for predicted, values in ((False, line), (True, line["predicted"])):
                for metric, _, colour in LATENCY_SERIES:
                    for stat, marker in STAT_MARKERS:
                        plot_series(ax_lat, xs, values[f"{metric}_{stat}_ms"], colour, marker,
                                    predicted=predicted, log=True)
                plot_series(ax_good, xs, values["goodput"], colours[key], "s",
                            predicted=predicted)
                plot_series(ax_frac, xs, values["slo_attainment"], colours[key], "^",
                            predicted=predicted, measured_style=":", alpha=0.7)
            if line["max_rate"] is not None:
                ax_good.axvline(data["x_of"][line["max_rate"]], color=colours[key],
                                linewidth=0.8, alpha=0.5)
            if line["predicted_max_rate"] is not None:
                ax_good.axvline(data["x_of"][line["predicted_max_rate"]], color=colours[key],
                                linewidth=0.8, alpha=0.5, linestyle=PREDICTED_DASH)
        for metric, _, colour in LATENCY_SERIES:
            if f"{metric}_ms" in slo:
                ax_lat.axhline(slo[f"{metric}_ms"], color=colour, linewidth=0.8,
                               linestyle=(0, (4, 2)), alpha=0.6)
        ax_frac.axhline(data["target"], color="#888888", linewidth=0.8, linestyle=":")
        ax_frac.set_ylim(0, 1.05)
        ax_frac.set_ylabel(TEXT["attainment"])
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel(TEXT["latency"])
        ax_good.set_ylabel(TEXT["goodput"])
        ax_good.set_xlabel(TEXT["rate"])
        ax_good.set_xticks(data["ticks"])
        ax_good.set_xticklabels(data["tick_text"])
        for ax in (ax_lat, ax_good):
            ax.grid(True, which="major", alpha=0.3)
        fig.suptitle(TEXT["title"] + "\n" + figure_caption(results))
        handles = [Line2D([], [], color=c, label=n) for _, n, c in LATENCY_SERIES]
        handles += [Line2D([], [], color="#555555", marker=m, linestyle="none", label=s)
                    for s, m in STAT_MARKERS]
        if data["has_predicted"]:
            handles.append(predicted_handle())
        legend = ax_lat.legend(handles=handles, fontsize="x-small", loc="best")
        good_handles = [Line2D([], [], color="#555555", marker="s", label="goodput"),
                        Line2D([], [], color="#555555", marker="^", linestyle=":",
                               label="within SLO")]
        if data["has_predicted"]:
            good_handles.append(predicted_handle("s"))
        if len(keys) > 1:
            good_handles += [Line2D([], [], color=colours[k], label=k[1]) for k in keys[:6]]
        ax_good.legend(handles=good_handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {"lines": lines, "path": str(path), "figure": fig, "axes": (ax_lat, ax_good, ax_frac),
            "legend": [t.get_text() for t in legend.get_texts()]}
