"""Figures (matplotlib, Agg, imported lazily): the roofline and the KV-cache comparison.

Every figure is sized for a paper column by default (3.5 in wide, 300 dpi; `size="slide"`
gives a 16:9 slide), names its model, dtype and hardware, has units on both axes and a
legend of at most eight entries. The encoding is the same on every roofline: marker
shape is the stage (prefill square, decode circle), marker size grows with the batch,
hollow is predicted and filled is measured (the fill entry appears only when measured
points are present), and colour is the operator family (Okabe-Ito, colour-blind safe)
or, on a measured roofline, the stage. `roofline_figure` joins a measured point to the
predicted point of the same `group`, so `infbench roofline` and the measured-roofline
reports share one drawing. Each figure function returns the coordinates it actually
plotted, read back from the matplotlib artists, so tests check the drawing rather than
the existence of a file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infbench.core.errors import UserError
from infbench.roofline.tables import RooflinePoint

if TYPE_CHECKING:
    from infbench.hardware.spec import HardwareSpec
    from infbench.roofline.tables import KVRow

FIGURE_FORMATS = ("png", "svg", "pdf")  # what --out may end with

# (width, height) in inches, dpi and base font size. A paper column is ~3.5 in; fonts
# are sized for print at 100 %, so 7 pt there reads like 10-11 pt on a slide.
FIGURE_SIZES: dict[str, tuple[tuple[float, float], int, float]] = {
    "column": ((3.5, 2.8), 300, 6.5),
    "slide": ((10.0, 5.625), 200, 12.0),
}

# Okabe-Ito: distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00",
             "#CC79A7")
# diffusion: a masked-diffusion refinement step (decoding.kind diffusion, docs/diffusion.md)
STAGE_COLOURS = {"prefill": "#D55E00", "decode": "#0072B2", "diffusion": "#009E73"}
STAGE_MARKERS = {"prefill": "s", "decode": "o", "diffusion": "^"}
OTHER_MARKER = "^"  # a measured step of a kind that is neither (e.g. mixed)

# Operator families: a 13-operator model stays a 5-colour legend. First match wins.
OP_FAMILIES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("whole step", ("(step)",), "#000000"),
    ("attention", ("attn", "attention", "scan", "ssm", "state", "mixer"), "#E69F00"),
    ("lm head", ("lm_head", "logits"), "#CC79A7"),
    ("norm / elementwise", ("norm", "rope", "act", "residual", "embed", "elementwise"),
     "#009E73"),
    ("GEMM (proj, MLP, MoE)", ("",), "#56B4E9"),  # projections, MLP, experts, router
)


def check_size(size: str, option: str = "--size") -> str:
    """A known figure size name, or a one-line UserError listing them."""
    if size not in FIGURE_SIZES:
        raise UserError(f"{option}: unknown value {size!r}; allowed: {', '.join(FIGURE_SIZES)}")
    return size


@contextmanager
def figure_style(size: str) -> Iterator[None]:
    """rc settings for `size` while a figure is drawn and saved (fonts, line widths)."""
    import matplotlib

    (_, _, font) = FIGURE_SIZES[check_size(size, "size")]
    scale = font / 10.0
    with matplotlib.rc_context({
        "font.size": font, "axes.titlesize": font + 0.5, "axes.labelsize": font,
        "xtick.labelsize": font - 0.5, "ytick.labelsize": font - 0.5,
        "legend.fontsize": font - 0.5, "lines.linewidth": 1.5 * scale,
        "lines.markersize": 6 * scale, "axes.linewidth": 0.8 * scale,
        "grid.linewidth": 0.5 * scale, "svg.fonttype": "none", "pdf.fonttype": 42,
    }):
        yield


def new_figure(size: str = "column") -> Any:
    """An Agg figure of a named size, without pyplot (no global state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    (inches, dpi, _) = FIGURE_SIZES[check_size(size, "size")]
    fig = Figure(figsize=inches, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def caption(*parts: Any) -> str:
    """'model · dtype · hardware': the line every figure carries under its title."""
    return " · ".join(str(p) for p in parts if p not in (None, ""))


def marker_size(batch: int | None, size: str) -> float:
    """Scatter area growing with log2(batch), so b=1, 8, 64 are three visible sizes."""
    base = 9.0 if size == "column" else 40.0
    return base * (1.0 + 0.6 * math.log2(batch)) if batch and batch > 0 else base


def family(point: RooflinePoint) -> tuple[str, str]:
    """The operator family (legend name, colour) of a point, read from its series."""
    name = (point.series or point.label).lower()
    for fam, keys, colour in OP_FAMILIES:
        if any(k in name for k in keys):
            return fam, colour
    raise AssertionError("the last family matches everything")


def check_figure_path(out_path: str | Path, option: str = "") -> Path:
    """A writable figure file path with a supported extension, checked before any drawing.

    `option` (e.g. "--out") names the command-line flag in the message.
    """
    path = Path(out_path)
    what = f"{option} {path}" if option else str(path)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FIGURE_FORMATS:
        got = f".{suffix}" if suffix else "no extension"
        raise UserError(f"{what}: unsupported figure format ({got}); allowed "
                        f"extensions: {', '.join('.' + f for f in FIGURE_FORMATS)}")
    if path.is_dir():
        raise UserError(f"{what}: is a directory; give a file name such as "
                        f"{path / 'roofline.png'}")
    if path.parent and not path.parent.is_dir():
        raise UserError(f"cannot write {path}: directory {path.parent} does not exist")
    return path


def save_figure(fig: Any, out_path: str | Path) -> Path:
    """Write PNG, SVG or PDF by the extension, at the figure's own size and dpi."""
    path = check_figure_path(out_path)
    try:
        # No bbox_inches="tight": the constrained layout already fits the labels, and the
        # file keeps the exact size asked for (3.5 in is 1050 px at 300 dpi).
        fig.savefig(path, format=path.suffix.lower().lstrip("."))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def _legend_handle(label: str, colour: str = "#555555", marker: str = "o",
                   filled: bool = True) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="none", marker=marker, markeredgecolor=colour,
                  markerfacecolor=colour if filled else "none", label=label)


def roof_curve(hw: HardwareSpec, dtype: str, intensities: Sequence[float],
               num: int = 256) -> tuple[float, float, float, list[float], list[float]]:
    """(peak FLOP/s, bandwidth, ridge point, intensities, attainable FLOP/s): the roof
    min(peak, bandwidth * intensity) on a log grid from a quarter of the lowest intensity
    (or the ridge) to four times the highest; every roofline drawing uses it."""
    peak, bw = hw.peak(dtype), hw.bandwidth
    ridge = peak / bw
    xs = [x for x in intensities if x > 0] + [ridge]
    lo, hi = math.log10(min(xs) / 4.0), math.log10(max(xs) * 4.0)
    grid = [10 ** (lo + (hi - lo) * i / (num - 1)) for i in range(num)]
    return peak, bw, ridge, grid, [min(peak, bw * x) for x in grid]


def roofline_figure(hw: HardwareSpec, dtype: str, points: Sequence[RooflinePoint],
                    out_path: str | Path, title: str | None = None, *,
                    model: str | None = None, size: str = "column",
                    colour_by: str = "family",
                    annotate: Callable[[RooflinePoint], str | None] | None = None,
                    ) -> dict[str, Any]:
    """Draw a log-log roofline with `points`; return what was plotted.

    colour_by: "family" (operator family, for the analytic figure with operators) or
    "stage" (prefill / decode, for measured-vs-predicted). annotate: the text put next to
    a point (default: `b=N` on whole-step points when more than one batch is drawn).
    """
    placed = [p for p in points if p.intensity > 0 and p.flops_per_s > 0]
    peak, bw, ridge, grid, roof = roof_curve(hw, dtype, [p.intensity for p in placed])
    batches = {p.batch for p in placed if p.batch}
    if annotate is None:
        def annotate(p: RooflinePoint) -> str | None:
            whole = p.group.count("/") == 1 or p.series.endswith("(step)")
            return f"b={p.batch}" if whole and p.batch and len(batches) > 1 else None

    with figure_style(size):
        fig = new_figure(size)
        ax = fig.add_subplot(1, 1, 1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.plot(grid, roof, color="black", linewidth=1.2 * FIGURE_SIZES[size][2] / 10 * 1.5,
                zorder=1)
        (ridge_marker,) = ax.plot([ridge], [peak], marker="D", color="#D55E00",
                                  linestyle="none", markersize=3 if size == "column" else 7,
                                  zorder=2)
        # Above the flat roof: below it sit the points this figure is about.
        ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak), textcoords="offset points",
                    xytext=(0, 4), ha="center", va="bottom", fontsize="x-small",
                    color="#D55E00")
        plotted: list[dict[str, Any]] = []
        colours: dict[str, str] = {}
        stacked: dict[str, int] = {}
        for p in placed:
            if colour_by == "stage":
                name, colour = p.stage, STAGE_COLOURS.get(p.stage, "#555555")
            else:
                name, colour = family(p)
            colours.setdefault(name, colour)
            marker = STAGE_MARKERS.get(p.stage, OTHER_MARKER)
            filled = p.kind == "measured"
            step_point = not p.group and p.kind == "measured"  # --steps: every engine step
            artist = ax.scatter(
                [p.intensity], [p.flops_per_s], marker=marker,
                s=marker_size(p.batch, size) * (0.35 if step_point else 1.0),
                facecolors=colour if filled else "none", edgecolors=colour,
                linewidths=0.8 if size == "column" else 1.5,
                alpha=0.35 if step_point else 0.9, zorder=3)
            (x, y) = artist.get_offsets()[0]
            text = None if step_point else annotate(p)
            if text:
                # prefill below-right, decode above-left: the two stages of one batch
                # often sit close together.
                below = p.stage == "prefill"
                rank = stacked.setdefault(p.stage, 0)
                stacked[p.stage] += 1  # prefill steps of several batches nearly coincide
                ax.annotate(text, (x, y), textcoords="offset points",
                            xytext=(3, -4 - 7 * rank) if below else (-3, 3),
                            ha="left" if below else "right", va="top" if below else "bottom",
                            fontsize="x-small", color=colour)
            plotted.append({"label": p.label, "kind": p.kind, "group": p.group,
                            "stage": p.stage, "batch": p.batch, "colour_key": name,
                            "marker": marker, "annotation": text,
                            "intensity": float(x), "flops_per_s": float(y)})
        links = _link_pairs(ax, placed)

        stages = [s for s in STAGE_MARKERS if any(p.stage == s for p in placed)]
        kinds = {p.kind for p in placed}
        handles = []
        if colour_by == "stage":
            handles += [_legend_handle(s, STAGE_COLOURS[s], STAGE_MARKERS[s]) for s in stages]
        else:
            handles += [_legend_handle(n, c, "o") for n, c in colours.items()]
            handles += [_legend_handle(s, "#555555", STAGE_MARKERS[s], False) for s in stages]
        if "measured" in kinds:  # say "measured" only where something was measured
            handles += [_legend_handle("predicted (hollow)", filled=False),
                        _legend_handle("measured (filled)")]
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("performance (FLOP/s)")
        ax.set_title(f"{title or 'Roofline'}\n{caption(model, dtype, hw.name)}")
        ax.grid(True, which="major", alpha=0.25)
        top = max([peak] + [p.flops_per_s for p in placed])
        ax.set_ylim(top=top * 3.0)  # room above the roof for the ridge label
        legend = ax.legend(handles=handles, loc="lower right", frameon=True, framealpha=0.85,
                           title="marker size: batch" if len(batches) > 1 else None,
                           title_fontsize="x-small", fontsize="x-small",
                           handletextpad=0.3, borderpad=0.3, labelspacing=0.25)
        path = save_figure(fig, out_path)
    rx, ry = ridge_marker.get_xydata()[0]
    return {
        "out_path": str(path),
        "figure": fig,
        "legend": [t.get_text() for t in legend.get_texts()],
        "ridge_point": {"intensity": float(rx), "flops_per_s": float(ry)},
        "peak_flops_per_s": peak,
        "bandwidth_bytes_per_s": bw,
        "roofline": {"intensity": [float(x) for x in grid],
                     "flops_per_s": [float(y) for y in roof]},
        "points": plotted,
        "links": links,
        "skipped": [p.label for p in points if p not in placed],
    }


def _link_pairs(ax: Any, points: Sequence[RooflinePoint]) -> list[dict[str, Any]]:
    """Join each measured point to the predicted point of its group (dashed)."""
    predicted = {p.group: p for p in points if p.kind == "predicted" and p.group}
    links = []
    for m in points:
        twin = predicted.get(m.group) if m.kind == "measured" and m.group else None
        if twin is None:
            continue
        (line,) = ax.plot([twin.intensity, m.intensity], [twin.flops_per_s, m.flops_per_s],
                          linestyle="--", color="grey", linewidth=0.6, zorder=2)
        (x0, y0), (x1, y1) = line.get_xydata()
        links.append({"group": m.group, "from": [float(x0), float(y0)],
                      "to": [float(x1), float(y1)]})
    return links


def kv_figure(rows: Sequence[KVRow], out_path: str | Path, title: str | None = None,
              size: str = "column", dtype: str | None = None,
              hardware: str | None = None) -> dict[str, Any]:
    """Bars: KV cache (+ constant state) of each model next to its MHA equivalent, in GB."""
    import numpy as np

    with figure_style(size):
        fig = new_figure(size)
        ax = fig.add_subplot(1, 1, 1)
        x = np.arange(len(rows))
        own = [(r.kv_cache_bytes + r.state_bytes_per_seq * r.batch) / 1e9 for r in rows]
        mha = [r.mha_kv_cache_bytes / 1e9 for r in rows]
        bars_mha = ax.bar(x - 0.2, mha, width=0.4, color="#BBBBBB",
                          label="MHA of the same shape")
        bars_own = ax.bar(x + 0.2, own, width=0.4, color="#0072B2", label="KV cache + state")
        for bar, r in zip(bars_own, rows, strict=True):
            ax.annotate(f"{r.reduction:.1f}x",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize="x-small")
        ax.set_xticks(x, [f"{r.model}\n({r.attention})" for r in rows], fontsize="x-small",
                      rotation=30 if len(rows) > 3 else 0, ha="right" if len(rows) > 3
                      else "center")
        ax.set_ylabel("KV cache (GB)")
        ax.set_xlabel("model (attention)")
        first = rows[0] if rows else None
        sub = caption(dtype, hardware,
                      f"{first.context_len} tokens x batch {first.batch}" if first else None)
        ax.set_title(f"{title or 'KV cache per model'}\n{sub}")
        ax.legend(fontsize="x-small")
        path = save_figure(fig, out_path)
    return {
        "out_path": str(path),
        "figure": fig,
        "models": [r.model for r in rows],
        "kv_gb": [float(b.get_height()) for b in bars_own],
        "mha_gb": [float(b.get_height()) for b in bars_mha],
    }


def kv_measured_figure(rows: Sequence[dict[str, Any]], out_path: str | Path,
                       title: str | None = None, size: str = "column",
                       hardware: str | None = None) -> dict[str, Any]:
    """`infbench kv --results --plot`: per run, predicted KV + state next to the measured
    peak allocation (MB, linear), and measured decode tokens/s in a panel below.

    A linear axis, not symlog: a run with no KV (a pure SSM) is a visible zero-height bar
    labelled "0", where symlog drew a fake "0" tick between decades.
    """
    import numpy as np

    def context(tokens: int) -> str:
        return f"{tokens / 1024:.0f}k" if tokens >= 1024 else str(tokens)

    many = len(rows) > 6  # a 24-run sweep: one rotated line per bar, or labels collide
    labels = [f"{r['scheme']}{' ' if many else chr(10)}{context(r['context_len'])}"
              for r in rows]
    with figure_style(size):
        fig = new_figure(size)
        (w, h) = FIGURE_SIZES[size][0]
        fig.set_size_inches(w, h * 1.35 if size == "column" else h)
        ax, speed = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        x = np.arange(len(rows))
        pred = [(r["kv_cache_bytes_predicted"]
                 + r["state_bytes_per_seq_predicted"] * r["batch"]) / 1e6 for r in rows]
        meas = [(r["peak_kv_bytes_measured"]
                 + r["state_bytes_per_seq_measured"] * r["batch"]) / 1e6 for r in rows]
        bars_pred = ax.bar(x - 0.2, pred, width=0.4, color="#BBBBBB",
                           label="predicted KV + state")
        bars_meas = ax.bar(x + 0.2, meas, width=0.4, color="#0072B2", label="measured peak")
        ax.set_ylabel("KV + state (MB)")
        ax.legend(fontsize="x-small", loc="upper left")
        tps = [r["decode_tokens_per_s_measured"] for r in rows]
        (line,) = speed.plot(x, [np.nan if v is None else v for v in tps], "o",
                             color="#D55E00")
        speed.set_ylabel("decode tok/s")
        speed.set_ylim(bottom=0)
        speed.set_xticks(x, labels, fontsize="xx-small" if many else "x-small",
                         rotation=90 if many else 0)
        speed.set_xlabel("scheme, context (tokens)")
        for a in (ax, speed):
            a.grid(True, axis="y", alpha=0.25)
        models = list(dict.fromkeys(str(r.get("model")) for r in rows))
        dtypes = list(dict.fromkeys(str(r["dtype"]) for r in rows if r.get("dtype")))
        sub = caption(models[0] if len(models) == 1 else f"{len(models)} models",
                      ", ".join(dtypes), hardware)
        ax.set_title(f"{title or 'KV cache per scheme: predicted vs measured'}"
                     + (f"\n{sub}" if sub else ""))
        path = save_figure(fig, out_path)
    return {
        "out_path": str(path),
        "figure": fig,
        "schemes": [r["scheme"] for r in rows],
        "predicted_mb": [float(b.get_height()) for b in bars_pred],
        "measured_mb": [float(b.get_height()) for b in bars_meas],
        "decode_tokens_per_s": [float(v) for v in line.get_ydata()],
    }
