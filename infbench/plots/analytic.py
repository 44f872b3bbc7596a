"""Figures (matplotlib, Agg, imported lazily): the roofline and the KV-cache comparison.

`roofline_figure` draws predicted points hollow and measured points filled on the
same log-log roofline and joins a measured point to the predicted point of the same
`group`, so `infbench roofline` and the measured-roofline reports share one drawing.
Each figure function returns the coordinates it actually plotted, read back from the
matplotlib artists, so tests check the drawing rather than the existence of a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infbench.core.errors import UserError
from infbench.roofline.tables import POINT_KINDS, RooflinePoint

if TYPE_CHECKING:
    from infbench.core.hardware import HardwareSpec
    from infbench.roofline.tables import KVRow

FIGURE_FORMATS = ("png", "svg", "pdf")  # what --out may end with


def _new_figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(fig)  # Agg without pyplot: no global state, no display needed
    return fig


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


def _save(fig: Any, out_path: str | Path) -> Path:
    path = check_figure_path(out_path)
    try:
        fig.savefig(path, bbox_inches="tight")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def roofline_figure(hw: HardwareSpec, dtype: str, points: Sequence[RooflinePoint],
                    out_path: str | Path, title: str | None = None) -> dict[str, Any]:
    """Draw a log-log roofline with `points`; return what was plotted."""
    import numpy as np

    peak, bw = hw.peak(dtype), hw.bandwidth
    ridge = peak / bw
    placed = [p for p in points if p.intensity > 0 and p.flops_per_s > 0]
    xs = [p.intensity for p in placed] + [ridge]
    lo, hi = min(xs) / 4.0, max(xs) * 4.0
    grid = np.logspace(np.log10(lo), np.log10(hi), 256)
    roof = np.minimum(peak, bw * grid)

    fig = _new_figure((9.0, 6.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot(grid, roof, color="black", linewidth=2, label=f"roofline ({hw.name}, {dtype})")
    ax.axhline(peak, color="grey", linestyle=":", linewidth=1)
    (ridge_marker,) = ax.plot([ridge], [peak], marker="D", color="red", linestyle="none",
                              markersize=8, label=f"ridge point {ridge:.0f} FLOP/B")
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak), textcoords="offset points",
                xytext=(8, -16), color="red")

    series = list(dict.fromkeys(p.series or p.group or p.label for p in placed))
    cmap = _colormap(len(series))
    plotted: list[dict[str, Any]] = []
    for i, name in enumerate(series):
        members = [p for p in placed if (p.series or p.group or p.label) == name]
        for kind in POINT_KINDS:
            pts = [p for p in members if p.kind == kind]
            if not pts:
                continue
            filled = kind == "measured"
            artist = ax.scatter(
                [p.intensity for p in pts], [p.flops_per_s for p in pts], s=46,
                facecolors=cmap(i) if filled else "none", edgecolors=cmap(i), linewidths=1.5,
                label=name if kind == "predicted" or not any(q.kind == "predicted"
                                                             for q in members) else None,
            )
            for p, (x, y) in zip(pts, artist.get_offsets(), strict=True):
                plotted.append({"label": p.label, "kind": p.kind, "group": p.group,
                                "intensity": float(x), "flops_per_s": float(y)})
    links = _link_pairs(ax, placed)

    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel(f"performance (FLOP/s, {dtype})")
    ax.set_title(title or f"Roofline: {hw.description}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="hollow: predicted, filled: measured", title_fontsize=7)
    path = _save(fig, out_path)
    rx, ry = ridge_marker.get_xydata()[0]
    return {
        "out_path": str(path),
        "ridge_point": {"intensity": float(rx), "flops_per_s": float(ry)},
        "peak_flops_per_s": peak,
        "bandwidth_bytes_per_s": bw,
        "roofline": {"intensity": [float(x) for x in grid],
                     "flops_per_s": [float(y) for y in roof]},
        "points": plotted,
        "links": links,
        "skipped": [p.label for p in points if p not in placed],
    }


def _colormap(n: int) -> Any:
    from matplotlib import colormaps

    return colormaps["tab20" if n > 10 else "tab10"]


def _link_pairs(ax: Any, points: Sequence[RooflinePoint]) -> list[dict[str, Any]]:
    """Join each measured point to the predicted point of its group (dashed)."""
    predicted = {p.group: p for p in points if p.kind == "predicted" and p.group}
    links = []
    for m in points:
        twin = predicted.get(m.group) if m.kind == "measured" and m.group else None
        if twin is None:
            continue
        (line,) = ax.plot([twin.intensity, m.intensity], [twin.flops_per_s, m.flops_per_s],
                          linestyle="--", color="grey", linewidth=1)
        (x0, y0), (x1, y1) = line.get_xydata()
        links.append({"group": m.group, "from": [float(x0), float(y0)],
                      "to": [float(x1), float(y1)]})
    return links


def kv_figure(rows: Sequence[KVRow], out_path: str | Path,
              title: str | None = None) -> dict[str, Any]:
    """Bars: KV cache (+ constant state) of each model next to its MHA equivalent, in GB."""
    import numpy as np

    fig = _new_figure((max(6.0, 1.6 * len(rows) + 3.0), 5.0))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(rows))
    own = [(r.kv_cache_bytes + r.state_bytes_per_seq * r.batch) / 1e9 for r in rows]
    mha = [r.mha_kv_cache_bytes / 1e9 for r in rows]
    bars_mha = ax.bar(x - 0.2, mha, width=0.4, color="lightgrey", label="MHA of the same shape")
    bars_own = ax.bar(x + 0.2, own, width=0.4, color="tab:blue", label="KV cache + state")
    for bar, r in zip(bars_own, rows, strict=True):
        ax.annotate(f"{r.reduction:.1f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"{r.model}\n({r.attention})" for r in rows], fontsize=8)
    ax.set_ylabel("GB")
    first = rows[0] if rows else None
    ax.set_title(title or (f"KV cache at {first.context_len} tokens x batch {first.batch}"
                           if first else "KV cache"))
    ax.legend(fontsize=8)
    path = _save(fig, out_path)
    return {
        "out_path": str(path),
        "models": [r.model for r in rows],
        "kv_gb": [float(b.get_height()) for b in bars_own],
        "mha_gb": [float(b.get_height()) for b in bars_mha],
    }


def kv_measured_figure(rows: Sequence[dict[str, Any]], out_path: str | Path,
                       title: str | None = None) -> dict[str, Any]:
    """`infbench kv --results --plot`: per run, predicted KV + state next to the measured
    peak allocation (MB, log scale), and measured decode tokens/s on a second axis."""
    import numpy as np

    fig = _new_figure((max(7.0, 0.9 * len(rows) + 4.0), 5.0))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(rows))
    pred = [(r["kv_cache_bytes_predicted"] + r["state_bytes_per_seq_predicted"] * r["batch"])
            / 1e6 for r in rows]
    meas = [(r["peak_kv_bytes_measured"] + r["state_bytes_per_seq_measured"] * r["batch"])
            / 1e6 for r in rows]
    bars_pred = ax.bar(x - 0.2, pred, width=0.4, color="lightgrey", label="predicted KV + state")
    bars_meas = ax.bar(x + 0.2, meas, width=0.4, color="tab:blue", label="measured peak")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylabel("MB")
    ax.set_xticks(x, [f"{r['scheme']}\n{r['context_len']}" for r in rows], fontsize=7,
                  rotation=90)
    speed = ax.twinx()
    tps = [r["decode_tokens_per_s_measured"] or 0.0 for r in rows]
    (line,) = speed.plot(x, tps, "o", color="tab:red", label="decode tok/s (measured)")
    speed.set_ylabel("decode tokens/s")
    handles = [bars_pred, bars_meas, line]
    ax.legend(handles, [str(h.get_label()) for h in handles], fontsize=8, loc="upper left")
    ax.set_title(title or "KV cache per scheme: predicted vs measured")
    path = _save(fig, out_path)
    return {
        "out_path": str(path),
        "schemes": [r["scheme"] for r in rows],
        "predicted_mb": [float(b.get_height()) for b in bars_pred],
        "measured_mb": [float(b.get_height()) for b in bars_meas],
        "decode_tokens_per_s": [float(v) for v in line.get_ydata()],
    }
