"""The Pareto view of a sweep: what each user gets against what the server delivers.

One point per result: x is the server's output tokens/s (`output_tokens_per_s`), divided by
the point's device count when every point has one (the in-process engine runs on one
device; a `target:` server's devices are not recorded, so a set with one plots per server);
y is the output tokens/s one user sees, 1 / TPOT p50, or, when no point of a result has a
TPOT (one-token outputs), the median over its requests of output tokens / E2E.  Moving up
costs throughput and moving right costs interactivity, so the points worth running are the
*Pareto front*: those no other point of the same curve beats on both axes.

One curve per target or variant: a result's `variant` (scenario `variants:`), else its
target (model at host), else its scenario name.  Each curve draws all its points hollow and
its front filled and joined.  Where the results hold `prediction.metrics` (the simulation
of the same requests, plots/predicted.py), each curve has its predicted twin: the same two
axes from the simulated output tokens/s and TPOT p50, every point a hollow square and the
predicted front joined by a dashed line, in the curve's colour.  A point without a
simulated TPOT gets no predicted marker (the simulation keeps no request rows to fall back
on).  Returns the plotted values, so tests check numbers rather than pixels; None (nothing
written) with fewer than two measured points that have both values.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from infbench.plots.measured import _run_colours, figure_caption
from infbench.plots.predicted import PREDICTED_DASH, predicted_handle, simulated
from infbench.results.accessor import metric

TEXT = {"title": "Per-user against per-server output tokens/s",
        "server": "output tok/s per server", "device": "output tok/s per device",
        "user": "output tok/s per user (1 / TPOT p50)"}


def per_user_tokens_per_s(result: dict[str, Any]) -> float | None:
    """1 / TPOT p50; without a TPOT, the median of output tokens / E2E over the requests."""
    tpot = metric(result, "tpot_s.p50")
    if tpot is not None and tpot > 0:
        return 1.0 / tpot
    rates = [r["num_output_tokens"] / (r["finish_s"] - r["arrival_s"])
             for r in result.get("requests") or []
             if r.get("finish_s") is not None and r.get("num_output_tokens")
             and r["finish_s"] > r["arrival_s"]]
    return statistics.median(rates) if rates else None


def device_count(result: dict[str, Any]) -> int | None:
    """The devices the point ran on: a recorded parallel layout's, 1 for the engine, None
    for a server (its devices are not in the result)."""
    scenario = result.get("scenario") or {}
    layout = scenario.get("parallel")
    if isinstance(layout, dict) and isinstance(layout.get("devices"), int):
        return int(layout["devices"])
    if scenario.get("target"):
        return None
    return 1


def curve_key(result: dict[str, Any]) -> str:
    """The curve a point belongs to: its variant, else its target, else its scenario name."""
    scenario = result.get("scenario") or {}
    variant = (scenario.get("swept") or {}).get("variant")
    if variant:
        return str(variant)
    target = scenario.get("target")
    if isinstance(target, dict):
        host = urlparse(str(target.get("base_url", ""))).netloc or "?"
        return f"{target.get('model', '?')} @ {host}"
    return str(result.get("name") or "run")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better), sorted
    by x; of equal points the first is kept."""
    front = []
    for i, (x, y) in enumerate(points):
        beaten = any((a >= x and b >= y) and ((a, b) != (x, y) or j < i)
                     for j, (a, b) in enumerate(points) if j != i)
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def predicted_per_user_tokens_per_s(result: dict[str, Any]) -> float | None:
    """1 / the simulated TPOT p50, or None without one."""
    tpot = simulated(result, "tpot_s.p50")
    return 1.0 / tpot if tpot is not None and tpot > 0 else None


def _with_front(points: list[dict[str, Any]]) -> list[int]:
    """The front's indices; marks each point's `on_front`."""
    front = pareto_front([(p["x"], p["y"]) for p in points])
    for i, p in enumerate(points):
        p["on_front"] = i in front
    return front


def pareto_data(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the figure draws: per curve its measured points (label, x, y, on_front) and
    front indices, its simulated points and front (`predicted`, `predicted_front`: empty
    without `prediction.metrics`), whether x is per device and `has_predicted`; None with
    fewer than two measured points that have both values."""
    counts = [device_count(r) for r in results]
    per_device = all(c is not None for c in counts)
    curves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r, devices in zip(results, counts, strict=True):
        curve = curves.setdefault(curve_key(r), {"measured": [], "predicted": []})
        for kind, server, user in (
                ("measured", metric(r, "output_tokens_per_s"), per_user_tokens_per_s(r)),
                ("predicted", simulated(r, "output_tokens_per_s"),
                 predicted_per_user_tokens_per_s(r))):
            if server is not None and user is not None:
                x = server / devices if per_device and devices else server
                curve[kind].append({"label": r.get("label"), "x": x, "y": user,
                                    "devices": devices})
    if sum(len(c["measured"]) for c in curves.values()) < 2:
        return None
    out = [{"key": key, "points": c["measured"], "front": _with_front(c["measured"]),
            "predicted": c["predicted"], "predicted_front": _with_front(c["predicted"])}
           for key, c in curves.items() if c["measured"]]
    return {"curves": out, "per_device": per_device,
            "has_predicted": any(c["predicted"] for c in out),
            "x_label": TEXT["device" if per_device else "server"]}


def pareto_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                  size: str = "column") -> dict[str, Any] | None:
    """The Pareto figure (see the module docstring)."""
    from infbench.plots.analytic import figure_style, new_figure, save_figure

    data = pareto_data(results)
    if data is None:
        return None
    with figure_style(size):
        fig = new_figure(size)
        ax = fig.subplots()
        colours = _run_colours(len(data["curves"]))
        for curve, colour in zip(data["curves"], colours, strict=True):
            points = curve["points"]
            ax.scatter([p["x"] for p in points], [p["y"] for p in points], marker="o",
                       facecolors="none", edgecolors=colour)
            front = [points[i] for i in curve["front"]]
            ax.plot([p["x"] for p in front], [p["y"] for p in front], marker="o",
                    color=colour, label=f"{curve['key']} (front)")
            predicted = curve["predicted"]
            if predicted:
                ax.scatter([p["x"] for p in predicted], [p["y"] for p in predicted],
                           marker="s", facecolors="none", edgecolors=colour)
                front = [predicted[i] for i in curve["predicted_front"]]
                ax.plot([p["x"] for p in front], [p["y"] for p in front], marker="s",
                        color=colour, markerfacecolor="none", linestyle=PREDICTED_DASH)
        ax.set_xlabel(data["x_label"])
        ax.set_ylabel(TEXT["user"])
        ax.grid(True, which="major", alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        if data["has_predicted"]:
            handles.append(predicted_handle("s"))
        legend = ax.legend(handles=handles, fontsize="x-small", loc="best")
        fig.suptitle(TEXT["title"] + "\n" + figure_caption(results))
        path = save_figure(fig, Path(out))
    return {**data, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}
