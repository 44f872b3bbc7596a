"""Latency and goodput against the request rate, for a rate sweep run with `measure.slo`.

Two panels sharing the x axis (requested rate, req/s; a rate of inf is drawn one step
right of the highest finite rate and labelled `inf`):

- top: TTFT and TPOT p50 (filled) and p99 (hollow) in ms, log scale, with each SLO
  objective as a dashed horizontal line of its metric's colour;
- bottom: goodput (req/s, left axis) and the fraction of requests within the SLOs (right
  axis, 0..1) with the target as a dotted line and the SLO max rate marked.

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
from infbench.results.goodput import goodput_rows, max_rate_summaries, rate_text

LATENCY_SERIES = (("ttft", "TTFT", "#0072B2"), ("tpot", "TPOT", "#D55E00"))
TEXT = {"title": "Latency and goodput vs request rate", "rate": "request rate (req/s)",
        "latency": "latency (ms)", "goodput": "goodput (req/s)", "attainment": "within SLO"}


def _positions(rates: list[float]) -> dict[float, float]:
    """x position of each rate: itself, and inf one typical step past the largest finite."""
    finite = sorted({r for r in rates if math.isfinite(r)})
    step = (finite[-1] - finite[0]) / max(len(finite) - 1, 1) if len(finite) > 1 else 1.0
    top = finite[-1] if finite else 0.0
    return {r: (r if math.isfinite(r) else top + step) for r in rates}


def goodput_rate_data(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the figure draws: one line per group (name, group, rates, x positions, TTFT/TPOT
    p50/p99 ms, goodput, slo_attainment, max_rate), the groups in order, the objectives
    and target, the x tick positions and labels and `x_of` (rate -> x); None when no
    result has both a rate and an SLO."""
    rows = [r for r in goodput_rows(results) if r["rate"] is not None]
    if not rows:
        return None
    summaries = {(m["name"], m["group"]): m for m in max_rate_summaries(results)}
    keys = list(dict.fromkeys((r["name"], r["group"]) for r in rows))
    xpos = _positions([r["rate"] for r in rows])
    lines: list[dict[str, Any]] = []
    for key in keys:
        pts = sorted((r for r in rows if (r["name"], r["group"]) == key),
                     key=lambda r: r["rate"])
        line: dict[str, Any] = {"name": key[0], "group": key[1],
                                "rates": [r["rate"] for r in pts],
                                "x": [xpos[r["rate"]] for r in pts]}
        for metric, _, _ in LATENCY_SERIES:
            for stat in ("p50", "p99"):
                line[f"{metric}_{stat}_ms"] = [r[f"{metric}_{stat}_ms"] for r in pts]
        line["goodput"] = [r["goodput_requests_per_s"] for r in pts]
        line["slo_attainment"] = [r["slo_attainment"] for r in pts]
        summary = summaries.get(key)
        line["max_rate"] = summary["max_rate"] if summary else None
        lines.append(line)
    ticks = sorted(set(xpos.values()))
    return {"lines": lines, "keys": keys, "slo": rows[0]["slo"], "target": rows[0]["target"],
            "ticks": ticks, "x_of": xpos,
            "tick_text": [rate_text(next(r for r, x in xpos.items() if x == t)) for t in ticks]}


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
            for metric, _, colour in LATENCY_SERIES:
                for stat, fill in (("p50", colour), ("p99", "none")):
                    ys = line[f"{metric}_{stat}_ms"]
                    xy = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
                    if xy:
                        ax_lat.plot([a for a, _ in xy], [b for _, b in xy], marker="o",
                                    color=colour, markerfacecolor=fill,
                                    linestyle="-" if stat == "p50" else "--")
            ax_good.plot(xs, [g if g is not None else math.nan for g in line["goodput"]],
                         marker="s", color=colours[key])
            ax_frac.plot(xs, [a if a is not None else math.nan for a in line["slo_attainment"]],
                         marker="^", linestyle=":", color=colours[key], alpha=0.7)
            if line["max_rate"] is not None:
                ax_good.axvline(data["x_of"][line["max_rate"]], color=colours[key],
                                linewidth=0.8, alpha=0.5)
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
        handles = [Line2D([], [], color=c, marker="o", label=f"{n} p50")
                   for _, n, c in LATENCY_SERIES]
        handles += [Line2D([], [], color="#555555", marker="o", markerfacecolor="none",
                           linestyle="--", label="p99")]
        legend = ax_lat.legend(handles=handles, fontsize="x-small", loc="best")
        good_handles = [Line2D([], [], color="#555555", marker="s", label="goodput"),
                        Line2D([], [], color="#555555", marker="^", linestyle=":",
                               label="within SLO")]
        if len(keys) > 1:
            good_handles += [Line2D([], [], color=colours[k], label=k[1]) for k in keys[:6]]
        ax_good.legend(handles=good_handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {"lines": lines, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}
