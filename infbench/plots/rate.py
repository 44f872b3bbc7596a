"""TTFT and TPOT against the request rate, for any rate sweep: measured and predicted.

Two panels sharing the x axis (requested rate, req/s; inf drawn one step right of the
highest finite rate, as in the goodput figure): TTFT on top, TPOT below, each at p50
(circles) and p90 (triangles) in ms on a log scale, one colour per group (what the sweep
varies besides the rate; results/goodput.py).  Measured is solid with filled markers; the
simulation of the same requests (`prediction.metrics`, plots/predicted.py) is dashed with
hollow markers, p50 and p90 being the statistics `report`'s under-load table compares.

Drawn for results of two distinct rates or more, with or without `measure.slo` (the goodput
figure needs one).  Returns the plotted values, so tests check numbers rather than pixels;
None (nothing written) otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infbench.plots.goodput import rate_axis
from infbench.plots.measured import _run_colours, figure_caption
from infbench.plots.predicted import ms, plot_series, predicted_handle, simulated
from infbench.results.accessor import metric
from infbench.results.goodput import group_label, rate_value

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"))
STAT_MARKERS = (("p50", "o"), ("p90", "^"))
SERIES = tuple(f"{m}_{s}_ms" for m, _ in METRICS for s, _ in STAT_MARKERS)
TEXT = {"title": "Latency vs request rate", "rate": "request rate (req/s)",
        "ttft": "TTFT (ms)", "tpot": "TPOT (ms)"}


def _rate(result: dict[str, Any]) -> float | None:
    workload = (result.get("scenario") or {}).get("workload")
    return rate_value(workload.get("rate")) if isinstance(workload, dict) else None


def latency_rate_data(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the figure draws: one line per (scenario, group) with its rates, labels, x
    positions, `measured` and `predicted` (each TTFT/TPOT p50/p90 in ms per point, None
    where the point has no value), the groups in order, the x axis (`x_of`, `ticks`,
    `tick_text`) and `has_predicted`; None with fewer than two distinct rates."""
    rated = [(r, rate) for r in results if (rate := _rate(r)) is not None]
    if len({rate for _, rate in rated}) < 2:
        return None
    axis = rate_axis([rate for _, rate in rated])
    keys = list(dict.fromkeys((r.get("name"), group_label(r)) for r, _ in rated))
    lines: list[dict[str, Any]] = []
    for key in keys:
        pts = sorted(((r, rate) for r, rate in rated
                      if (r.get("name"), group_label(r)) == key), key=lambda p: p[1])
        lines.append({
            "name": key[0], "group": key[1], "rates": [rate for _, rate in pts],
            "labels": [r.get("label") for r, _ in pts],
            "x": [axis["x_of"][rate] for _, rate in pts],
            "measured": {f"{m}_{s}_ms": [ms(metric(r, f"{m}_s.{s}")) for r, _ in pts]
                         for m, _ in METRICS for s, _ in STAT_MARKERS},
            "predicted": {f"{m}_{s}_ms": [ms(simulated(r, f"{m}_s.{s}")) for r, _ in pts]
                          for m, _ in METRICS for s, _ in STAT_MARKERS}})
    has_predicted = any(v is not None for line in lines
                        for values in line["predicted"].values() for v in values)
    return {"lines": lines, "keys": keys, "has_predicted": has_predicted, **axis}


def latency_rate_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                        size: str = "column") -> dict[str, Any] | None:
    """The latency-against-rate figure (see the module docstring)."""
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    data = latency_rate_data(results)
    if data is None:
        return None
    keys = data["keys"]
    with figure_style(size):
        fig = new_figure(size)
        axes = dict(zip((m for m, _ in METRICS), fig.subplots(2, 1, sharex=True), strict=True))
        colours = dict(zip(keys, _run_colours(len(keys)), strict=True))
        drawn: list[dict[str, Any]] = []
        for line in data["lines"]:
            colour = colours[(line["name"], line["group"])]
            for kind in ("measured", "predicted"):
                for m, _ in METRICS:
                    for stat, marker in STAT_MARKERS:
                        series = f"{m}_{stat}_ms"
                        xy = plot_series(axes[m], line["x"], line[kind][series], colour,
                                         marker, predicted=kind == "predicted", log=True)
                        if xy:
                            drawn.append({"name": line["name"], "group": line["group"],
                                          "kind": kind, "series": series, "xy": xy})
        for m, _ in METRICS:
            axes[m].set_yscale("log")
            axes[m].set_ylabel(TEXT[m])
            axes[m].grid(True, which="major", alpha=0.3)
        axes["tpot"].set_xlabel(TEXT["rate"])
        axes["tpot"].set_xticks(data["ticks"])
        axes["tpot"].set_xticklabels(data["tick_text"])
        fig.suptitle(TEXT["title"] + "\n" + figure_caption(results))
        handles = [Line2D([], [], color="#555555", marker=mk, label=f"{stat} (measured)")
                   for stat, mk in STAT_MARKERS]
        if data["has_predicted"]:
            handles.append(predicted_handle())
        if len(keys) > 1:
            handles += [Line2D([], [], color=colours[k], label=k[1] if len({n for n, _ in keys})
                               == 1 else f"{k[0]} {k[1]}") for k in keys[:6]]
        legend = axes["ttft"].legend(handles=handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {"lines": data["lines"], "drawn": drawn, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}
