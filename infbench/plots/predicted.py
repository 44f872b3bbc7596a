"""The predicted-under-load series the figures draw beside the measured ones.

Every result `run` writes holds `prediction.metrics`: the point's own requests through the
simulated engine (measure/simulation.py, docs/predictions-under-load.md), in the shape of
the measured `metrics`.  The latency-throughput, latency-against-rate, goodput and Pareto
figures draw it the same way everywhere: a dashed line in the measured curve's colour
through hollow markers of the measured curve's shape, under one legend entry,
`predicted (simulation)`.  A point whose result has no simulated value (a file written
before the simulation, a point it does not simulate, a percentile it has no samples for)
gets no predicted marker: nothing is filled in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from infbench.results.accessor import metric

PREDICTED_LABEL = "predicted (simulation)"
PREDICTED_DASH: Final = "--"  # matplotlib's; plotly's is "dash"


def simulated(result: Mapping[str, Any], name: str) -> float | None:
    """The simulated value of a metric name (`ttft_s.p50`, `output_tokens_per_s`), or None
    when the result has no `prediction.metrics` or not that metric."""
    return metric(result, f"prediction.metrics.{name}")


def ms(value: float | None) -> float | None:
    """Seconds to milliseconds, None kept."""
    return None if value is None else value * 1e3


def drawable(xs: Sequence[float], ys: Sequence[float | None],
             log: bool = False) -> list[tuple[float, float]]:
    """The (x, y) pairs with a finite y (positive on a log axis): what a series plots."""
    return [(x, y) for x, y in zip(xs, ys, strict=True)
            if y is not None and math.isfinite(y) and (y > 0 or not log)]


def plot_series(ax: Any, xs: Sequence[float], ys: Sequence[float | None], colour: Any,
                marker: str, *, predicted: bool, log: bool = False,
                measured_style: str = "-", **kw: Any) -> list[tuple[float, float]]:
    """Draw one series on a matplotlib axis: measured with `measured_style` and filled
    markers, predicted dashed with hollow markers, both in `colour`; the points without a
    value are left out (not drawn as zero).  Returns the (x, y) pairs drawn."""
    xy = drawable(xs, ys, log)
    if xy:
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker=marker, color=colour,
                linestyle=PREDICTED_DASH if predicted else measured_style,
                markerfacecolor="none" if predicted else colour, **kw)
    return xy


def predicted_handle(marker: str = "o") -> Any:
    """The legend entry of every predicted series (grey: the colours stay the runs')."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color="#555555", marker=marker, markerfacecolor="none",
                  linestyle=PREDICTED_DASH, label=PREDICTED_LABEL)
