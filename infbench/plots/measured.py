"""Figures from measured result files: measured roofline, latency-throughput, distributions.

Each figure function writes a PNG, SVG or PDF (matplotlib's Agg backend, imported lazily),
sized and styled as `infbench.plots.analytic` describes, and
returns the coordinates it plotted, so tests check values rather than pixels.

- `measured_roofline_points`: every run's prefill and decode stage at (measured
  arithmetic intensity, achieved FLOP/s) next to its predicted twin at (predicted
  intensity, predicted FLOP/s = predicted step FLOPs / predicted step time), the pair in
  one group (joined by a line) and each run in one series (one colour);
  `infbench.plots.roofline_figure` draws them against the roof.
- `latency_throughput_figure`: output tok/s against TPOT p50 (decode) and TTFT p50
  (prefill), one point per sweep point annotated with what the sweep varies: batching
  buys throughput with per-token latency (and the roofline says why: decode stays
  bandwidth-bound while the weights are shared by more tokens).  Measured solid and
  filled; the roofline's prediction of one batch hollow and dotted; the simulation of the
  point's requests (`prediction.metrics`, plots/predicted.py) hollow and dashed.
- `distributions_figure`: the CDF of per-token ITL when the result carries per-request
  samples (`requests[i].itl_s`), else of decode-step durations, labelled as such (every
  running sequence gets one token per decode step); and TTFT / TPOT / ITL / E2E
  p50 / p90 / p99, one colour per run and one marker per metric.
- `accuracy_speed_figure`: decode tok/s against perplexity, one marker per variant and batch.
- `speculative_figure`: speed-up over plain decoding against the draft tokens k, measured
  (solid) and predicted from the measured acceptance and draft cost (dashed), one colour
  per variant and one panel per batch size, a line at 1.0 (no gain).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

from infbench.core.errors import ResultSchemaError, UserError
from infbench.hardware.spec import HardwareSpec
from infbench.plots.predicted import PREDICTED_DASH, PREDICTED_LABEL, ms, simulated
from infbench.results.accessor import metric as result_metric
from infbench.results.accessor import scenario_number, value_at
from infbench.results.report import short_label
from infbench.roofline.tables import RooflinePoint

_STAGES = ("prefill", "decode", "diffusion")  # diffusion: decoding.kind diffusion points


def _where(result: dict[str, Any]) -> str:
    """The file a result came from (gate.load_results records it), for error messages."""
    return str(result.get("_path") or f"result {result.get('name')!r}")


def _section(result: dict[str, Any], key: str) -> dict[str, Any]:
    """A JSON-object field of a result; missing or null is {} (every reader tolerates gaps)."""
    value = result.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ResultSchemaError(f"{_where(result)}: field {key!r} must be a JSON object "
                                f"(got {type(value).__name__})")
    return value


def _dtype(result: dict[str, Any]) -> str:
    dtype = _section(result, "scenario").get("dtype", "float32")
    if not isinstance(dtype, str):
        raise ResultSchemaError(f"{_where(result)}: field 'scenario.dtype' must be a string "
                                f"(got {dtype!r})")
    return dtype


def _steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    value = result.get("steps")
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise ResultSchemaError(f"{_where(result)}: field 'steps' must be a list of JSON objects")
    return value


def _result_hardware(result: dict[str, Any]) -> HardwareSpec:
    """The hardware a result was analysed against: its `hardware` field, else its scenario's
    hardware name from the table (older or hand-edited files), else a one-line error."""
    from infbench.hardware.spec import get_hardware

    data = _section(result, "hardware")
    if not data:
        name = _section(result, "scenario").get("hardware")
        if isinstance(name, str) and name:
            try:
                return get_hardware(name)
            except UserError as exc:
                raise ResultSchemaError(f"{_where(result)}: field 'hardware' is missing and "
                                        f"scenario.hardware does not resolve ({exc})") from exc
        raise ResultSchemaError(f"{_where(result)}: field 'hardware' is missing; pass "
                                "--hardware NAME to plot against a known part")
    names = {f.name for f in fields(HardwareSpec)}
    try:
        return HardwareSpec(**{k: v for k, v in data.items() if k in names})
    except (TypeError, ValueError) as exc:  # ConfigError is a ValueError; TypeError: a key gone
        raise ResultSchemaError(f"{_where(result)}: field 'hardware' is not a hardware spec "
                                f"({exc})") from exc


def _hardware(results: list[dict[str, Any]], hardware: HardwareSpec | None) -> HardwareSpec:
    if hardware is not None:
        return hardware
    if not results:
        raise UserError("no result files to plot")
    return _result_hardware(results[0])


def point_labels(results: list[dict[str, Any]]) -> list[str]:
    """The run labels, prefixed with the scenario name when labels alone collide."""
    labels = [str(r.get("label") or r.get("name")) for r in results]
    if len(set(labels)) < len(labels):
        labels = [f"{r.get('name')}:{lab}" for r, lab in zip(results, labels, strict=True)]
    return labels


def _predicted_flops_per_s(stage: dict[str, Any], hw: HardwareSpec | None,
                           dtype: str) -> float | None:
    flops = value_at(stage, ["flops"])
    # Stage FLOPs are per step (decode: the mean step), so divide by the step time.
    time_s = (value_at(stage, ["time_s"]) or value_at(stage, ["step_time_s"])
              or value_at(stage, ["time_per_token_s"]))
    if flops is not None and time_s:
        return flops / time_s
    intensity = value_at(stage, ["intensity"])
    if intensity is not None and hw is not None:  # no predicted time: the attainable roof
        return min(hw.peak(dtype), intensity * hw.bandwidth)
    return None


def measured_roofline_points(results: list[dict[str, Any]], hardware: HardwareSpec | None = None,
                             include_steps: bool = False) -> list[RooflinePoint]:
    """Measured prefill/decode points of every run and their predicted twins."""
    points: list[RooflinePoint] = []
    for r, run in zip(results, point_labels(results), strict=True):
        hw = hardware or (_result_hardware(r) if r.get("hardware") else None)
        bs = scenario_number(r, "workload.batch_size")
        batch = None if bs is None else int(bs)
        dtype = _dtype(r)
        prediction = _section(r, "prediction")
        for stage in _STAGES:
            intensity = result_metric(r, f"{stage}.intensity")
            achieved = result_metric(r, f"{stage}.achieved_flops_per_s")
            # group pairs a stage with its predicted twin (the figure links them);
            # series keeps one colour per run.
            if intensity and achieved:
                points.append(RooflinePoint(f"{run} {stage}", intensity, achieved, "measured",
                                            f"{run} {stage}", run, stage, batch))
            predicted = prediction.get(stage) or {}
            p_intensity = result_metric(r, f"prediction.{stage}.intensity")
            p_flops = _predicted_flops_per_s(predicted, hw, dtype)
            if p_intensity and p_flops:
                points.append(RooflinePoint(f"{run} {stage} (predicted)", p_intensity, p_flops,
                                            "predicted", f"{run} {stage}", run, stage, batch))
        if include_steps:
            for step in _steps(r):
                duration = value_at(step, ["duration_s"])
                flops = value_at(step, ["flops"])
                intensity = value_at(step, ["intensity"])
                if duration and flops and intensity:
                    points.append(RooflinePoint(
                        f"{run} step {step.get('index')}", intensity, flops / duration,
                        "measured", "", run, str(step.get("stage") or "step"), batch))
    return points


def model_name(result: dict[str, Any]) -> str:
    """The model a result ran: its config's name, else the scenario's preset/path/GGUF."""
    name = _section(result, "model_config").get("name")
    if isinstance(name, str) and name:
        return name
    model = _section(result, "scenario").get("model")
    if isinstance(model, dict):
        for key in ("preset", "path", "gguf"):
            if isinstance(model.get(key), str):
                return Path(model[key]).name
    return "model?"


def figure_caption(results: list[dict[str, Any]], hw: HardwareSpec | None = None) -> str:
    """'model · dtype · hardware' of a set of results ('3 models' when they differ)."""
    from infbench.plots.analytic import caption

    def one_or_count(values: list[str], noun: str) -> str:
        distinct = list(dict.fromkeys(values))
        return distinct[0] if len(distinct) == 1 else f"{len(distinct)} {noun}"

    if not results:
        return ""
    targets = [t for t in (_section(r, "scenario").get("target") for r in results)
               if isinstance(t, dict)]
    if len(targets) == len(results):  # an HTTP target: what and where it served
        from urllib.parse import urlparse

        return caption(one_or_count([str(t.get("model", "?")) for t in targets], "models"),
                       "served", one_or_count([urlparse(str(t.get("base_url", ""))).netloc
                                               or "?" for t in targets], "endpoints"))
    hw_names = ([hw.name] if hw is not None else
                [str(_section(r, "hardware").get("name")
                     or _section(r, "scenario").get("hardware") or "?") for r in results])
    return caption(one_or_count([model_name(r) for r in results], "models"),
                   one_or_count([_dtype(r) for r in results], "dtypes"),
                   one_or_count(hw_names, "hardware parts"))


def swept_labels(results: list[dict[str, Any]]) -> list[str]:
    """What the sweep varies at each point, short: `b=8`, `rate=2.0`.

    Read from the result's label (the sweep's key=value, batch_size shortened to b);
    without one, the batch size.
    Prefixed with the scenario name when several scenarios are plotted together.
    """
    labels = []
    for r in results:
        label = r.get("label")
        if label:  # batch_size=8 -> b=8: annotations sit next to 2 mm markers
            labels.append(short_label(label).replace("batch_size=", "b="))
            continue
        bs = scenario_number(r, "workload.batch_size")
        labels.append(f"b={int(bs)}" if bs is not None else str(r.get("name")))
    names = {str(r.get("name")) for r in results}
    if len(names) > 1 or len(set(labels)) < len(labels):
        labels = [f"{r.get('name')}:{lab}" for r, lab in zip(results, labels, strict=True)]
    return labels


def measured_roofline_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                             hardware: HardwareSpec | None = None, include_steps: bool = False,
                             title: str | None = None, size: str = "column") -> dict[str, Any]:
    """The measured roofline; returns roofline_figure's dict (plotted points, links).

    Colour and shape tell prefill (square) from decode (circle), filled is measured and
    hollow predicted, and each measured point is annotated with what the sweep varies.
    """
    from infbench.plots.analytic import roofline_figure

    hw = _hardware(results, hardware)
    dtype = _dtype(results[0])
    points = measured_roofline_points(results, hw, include_steps)
    swept = dict(zip(point_labels(results), swept_labels(results), strict=True))

    def annotate(p: RooflinePoint) -> str | None:
        return swept.get(p.series) if p.kind == "measured" and p.group else None

    return roofline_figure(hw, dtype, points, Path(out),
                           title=title or "Measured vs predicted roofline",
                           model=figure_caption(results, hw).split(" · ")[0], size=size,
                           colour_by="stage", annotate=annotate)


class FigureText(NamedTuple):
    """A figure's title and axis titles, shared by its matplotlib and HTML drawings."""

    title: str
    x: str
    y: str


FIGURE_TEXT = {
    "latency_throughput": FigureText("Latency vs throughput", "output throughput (tokens/s)",
                                     "latency p50 (ms)"),
    "itl_cdf": FigureText("ITL distribution", "inter-token latency (ms)",
                          "fraction of tokens"),
    "decode_step_cdf": FigureText("Decode-step time distribution", "decode step time (ms)",
                                  "fraction of decode steps"),
    "percentiles": FigureText("Latency percentiles (colour: run)", "percentile",
                              "latency (ms)"),
    "accuracy_speed": FigureText("Speed vs accuracy",
                                 "perplexity, held-out text (lower is better)",
                                 "decode tokens/s (higher is better)"),
    "speculative_speedup": FigureText("Speculative decoding speed-up", "draft tokens k",
                                      "speed-up over plain decode"),
    "roofline": FigureText("Measured vs predicted roofline", "arithmetic intensity (FLOP/byte)",
                           "performance (FLOP/s)"),
}

RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
# TTFT is the prefill side, TPOT/ITL the decode side, E2E both: shape says which.
METRIC_STYLES: dict[str, tuple[str, Any]] = {
    "ttft": ("s", "-"), "tpot": ("o", "--"), "itl": ("^", ":"), "e2e": ("D", "-.")}


def _run_colours(n: int) -> list[Any]:
    """One colour per run: Okabe-Ito up to 7, a sequential map beyond (the sweep's order)."""
    if n <= len(RUN_COLOURS):
        return list(RUN_COLOURS[:n])
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(1, n - 1) * 0.9) for i in range(n)]


# The latency-throughput figure's series: the measured points, the roofline's prediction of
# one batch (`prediction.tpot_s`...) and the simulation under load (`prediction.metrics`).
LATENCY_THROUGHPUT_KINDS = ("measured", "predicted", "simulated")
KIND_TEXT = {"measured": "measured", "predicted": "predicted (roofline)",
             "simulated": PREDICTED_LABEL}
KIND_LINES: dict[str, Any] = {"measured": "-", "predicted": ":", "simulated": PREDICTED_DASH}


def latency_throughput_data(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The points of the latency-throughput figure (`plots` and the HTML report draw these):
    one per sweep point and kind (`measured`, `predicted`: the roofline's batch,
    `simulated`: `prediction.metrics`), each with x (output tok/s), y (TPOT p50, ms),
    ttft_ms (TTFT p50) and what the sweep varies; sorted by x.  A point is in a kind only
    where that kind has its throughput and TPOT."""
    swept = swept_labels(results)
    measured: list[dict[str, Any]] = []
    predicted: list[dict[str, Any]] = []
    simulation: list[dict[str, Any]] = []
    for r, label in zip(results, swept, strict=True):
        bs = scenario_number(r, "workload.batch_size")
        base = {"name": r.get("name"), "label": r.get("label"), "swept": label,
                "batch_size": None if bs is None else int(bs)}
        x, y, t = (result_metric(r, "output_tokens_per_s"), result_metric(r, "tpot_s.p50"),
                   result_metric(r, "ttft_s.p50"))
        if x is not None and y is not None:
            measured.append({**base, "x": x, "y": y * 1e3,
                             "ttft_ms": None if t is None else t * 1e3})
        px, py, pt = (result_metric(r, "prediction.output_tokens_per_s"),
                      result_metric(r, "prediction.tpot_s"), result_metric(r, "prediction.ttft_s"))
        if px is not None and py is not None:
            predicted.append({**base, "x": px, "y": py * 1e3,
                              "ttft_ms": None if pt is None else pt * 1e3})
        sx, sy = simulated(r, "output_tokens_per_s"), simulated(r, "tpot_s.p50")
        if sx is not None and sy is not None:
            simulation.append({**base, "x": sx, "y": sy * 1e3,
                               "ttft_ms": ms(simulated(r, "ttft_s.p50"))})
    for series in (measured, predicted, simulation):
        series.sort(key=lambda d: d["x"])
    return {"measured": measured, "predicted": predicted, "simulated": simulation}


def latency_throughput_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                              size: str = "column") -> dict[str, Any]:
    """x: output tok/s; y: TPOT p50 (decode, circles) and TTFT p50 (prefill, squares), ms.

    One point per sweep point, annotated with what the sweep varies (batch size, rate...);
    measured filled and joined by solid lines, the roofline's prediction hollow and dotted,
    the simulation's (`prediction.metrics`) hollow and dashed, one colour per scenario.
    """
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    data = latency_throughput_data(results)
    measured = data["measured"]
    text = FIGURE_TEXT["latency_throughput"]
    with figure_style(size):
        fig = new_figure(size)
        ax = fig.add_subplot(1, 1, 1)
        names = list(dict.fromkeys(str(d["name"]) for kind in LATENCY_THROUGHPUT_KINDS
                                   for d in data[kind]))
        colours = dict(zip(names, _run_colours(len(names)), strict=True))
        for kind in LATENCY_THROUGHPUT_KINDS:
            filled = kind == "measured"
            for name in names:
                pts = [d for d in data[kind] if str(d["name"]) == name]
                for key, metric in (("y", "tpot"), ("ttft_ms", "ttft")):
                    xy = [(d["x"], d[key]) for d in pts if d[key] is not None]
                    if not xy:
                        continue
                    ax.plot([a for a, _ in xy], [b for _, b in xy],
                            marker=METRIC_STYLES[metric][0], linestyle=KIND_LINES[kind],
                            color=colours[name],
                            markerfacecolor=colours[name] if filled else "none",
                            alpha=0.6 if kind == "predicted" else 1.0)
        for d in measured:
            ax.annotate(d["swept"], (d["x"], d["y"]), textcoords="offset points",
                        xytext=(3, -8), fontsize="x-small", color=colours[str(d["name"])])
        ax.set_yscale("log")
        ax.set_xlabel(text.x)
        ax.set_ylabel(text.y)
        ax.set_title(text.title + "\n" + figure_caption(results))
        ax.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color="#555555", marker="o", linestyle="none",
                          label="TPOT p50 (decode)"),
                   Line2D([], [], color="#555555", marker="s", linestyle="none",
                          label="TTFT p50 (prefill)")]
        kinds = [k for k in LATENCY_THROUGHPUT_KINDS if data[k]]
        if kinds != ["measured"]:  # a line style per kind once there is more than one
            handles += [Line2D([], [], color="#555555", marker="o", linestyle=KIND_LINES[k],
                               markerfacecolor="#555555" if k == "measured" else "none",
                               label=KIND_TEXT[k]) for k in kinds]
        if len(names) > 1:
            handles += [Line2D([], [], color=colours[n], linestyle="-", label=n)
                        for n in names[:8 - len(handles)]]
        legend = ax.legend(handles=handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {**data, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}


def decode_step_ms(result: dict[str, Any]) -> list[float]:
    """Durations (ms) of the decode-only steps: the inter-token gap each running request saw."""
    out = []
    for s in _steps(result):
        stage = s.get("stage")
        if stage is None:  # older results: a step with no prompt tokens is a decode step
            is_decode = not s.get("num_prefill_tokens") and bool(s.get("num_decode_tokens"))
        else:
            is_decode = stage == "decode"
        duration = value_at(s, ["duration_s"])
        if is_decode and duration is not None:
            out.append(duration * 1e3)
    return sorted(out)


def itl_samples_ms(result: dict[str, Any]) -> list[float] | None:
    """Every request's inter-token latencies (ms), or None when the result has no
    per-request rows (`result["requests"][i]["itl_s"]`)."""
    rows = result.get("requests")
    if not isinstance(rows, list):
        return None
    samples: list[float] = []
    found = False
    for row in rows:
        itl = row.get("itl_s") if isinstance(row, dict) else None
        if not isinstance(itl, list):
            continue
        found = True
        samples += [float(v) * 1e3 for v in itl
                    if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sorted(samples) if found else None


PERCENTILES = ("p50", "p90", "p99")


def cdf(values: list[float]) -> dict[str, list[float]]:
    """An empirical CDF: the sorted values and the fraction at or below each."""
    xs = sorted(values)
    return {"x": xs, "y": [(i + 1) / len(xs) for i in range(len(xs))]}


def itl_cdf_data(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per run label: the CDF of its per-token ITL (ms), or of its decode-step times where
    the result has no per-request samples; `source` says which (itl | decode_step)."""
    out: dict[str, dict[str, Any]] = {}
    for r, label in zip(results, point_labels(results), strict=True):
        samples = itl_samples_ms(r)
        source = "itl" if samples is not None else "decode_step"
        out[label] = {**cdf(samples if samples is not None else decode_step_ms(r)),
                      "source": source}
    return out


def cdf_text(sources: set[str]) -> FigureText:
    """The ITL panel's titles for what it draws: per-token ITL, decode steps, or a mix."""
    if sources <= {"itl"}:
        return FIGURE_TEXT["itl_cdf"]
    if sources == {"decode_step"}:
        return FIGURE_TEXT["decode_step_cdf"]
    return FigureText(FIGURE_TEXT["decode_step_cdf"].title,
                      "ITL (ms); decode step time where no per-token samples", "fraction")


def percentile_data(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per run label, per metric (`ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_ms`): p50/p90/p99."""
    return {label: {f"{metric}_ms": {q: (None if (v := result_metric(r, f"{metric}_s.{q}"))
                                         is None else v * 1e3) for q in PERCENTILES}
                    for metric in METRIC_STYLES}
            for r, label in zip(results, point_labels(results), strict=True)}


def distributions_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                         size: str = "column") -> dict[str, Any]:
    """Top (left on a slide): CDF of per-token ITL, or of decode-step time when the results
    carry no per-request samples (and the panel says so); bottom: TTFT / TPOT / ITL / E2E
    p50, p90, p99, one colour per run and one marker and line style per metric."""
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    labels = point_labels(results)
    swept = swept_labels(results)
    colours = _run_colours(len(results))
    itl = itl_cdf_data(results)
    pct = percentile_data(results)
    sources = {series["source"] for series in itl.values()}
    with figure_style(size):
        fig = new_figure(size)
        if size == "column":  # stacked: two panels side by side do not fit 3.5 in
            fig.set_size_inches(3.5, 4.6)
            ax_cdf, ax_pct = fig.subplots(2, 1)
        else:
            ax_cdf, ax_pct = fig.subplots(1, 2)
        for label, name, colour in zip(labels, swept, colours, strict=True):
            if itl[label]["x"]:
                ax_cdf.step(itl[label]["x"], itl[label]["y"], where="post", color=colour,
                            label=name)
        text = cdf_text(sources)
        ax_cdf.set_xlabel(text.x)
        ax_cdf.set_ylabel(text.y)
        ax_cdf.set_title(text.title + "\n" + figure_caption(results))
        ax_cdf.grid(True, which="major", alpha=0.3)
        if len(results) <= 8 and ax_cdf.get_legend_handles_labels()[0]:
            ax_cdf.legend(fontsize="x-small", loc="lower right")
        qs = PERCENTILES
        for label, colour in zip(labels, colours, strict=True):
            for metric, (marker, line) in METRIC_STYLES.items():
                ys_q = pct[label][f"{metric}_ms"]
                xy = [(i, ys_q[q]) for i, q in enumerate(qs) if ys_q[q] is not None]
                if xy:
                    ax_pct.plot([a for a, _ in xy], [b for _, b in xy], marker=marker,
                                linestyle=line, color=colour)
        ax_pct.set_xticks(range(3), list(qs))
        ax_pct.set_xlim(-0.3, 2.3)
        ax_pct.set_yscale("log")
        ax_pct.set_xlabel(FIGURE_TEXT["percentiles"].x)
        ax_pct.set_ylabel(FIGURE_TEXT["percentiles"].y)
        ax_pct.set_title(FIGURE_TEXT["percentiles"].title)
        ax_pct.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color="#555555", marker=mk, label=f"{metric.upper()}")
                   for metric, (mk, _) in METRIC_STYLES.items()]
        for handle, (_, ls) in zip(handles, METRIC_STYLES.values(), strict=True):
            handle.set_linestyle(ls)
        ax_pct.legend(handles=handles, fontsize="x-small", ncols=2, loc="best")
        path = save_figure(fig, Path(out))
    return {"itl_cdf": itl, "percentiles": pct, "path": str(path), "figure": fig}


def accuracy_speed_points(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per variant and batch size with a perplexity and a decode speed: variant,
    batch_size, perplexity, decode_tokens_per_s (results/variants.py)."""
    from infbench.results.variants import variant_rows

    points = []
    for row in variant_rows(results):
        if row["perplexity"] is None:
            continue
        for batch, speed in sorted(row["decode_tokens_per_s"].items()):
            if speed is not None:
                points.append({"variant": row["variant"], "batch_size": batch,
                               "perplexity": row["perplexity"], "decode_tokens_per_s": speed})
    return points


def accuracy_speed_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                          size: str = "column") -> dict[str, Any] | None:
    """x: perplexity on the held-out text; y: decode tokens/s; one marker per variant and
    batch size (results/variants.py).  None (nothing written) when no result carries a
    perplexity (`accuracy`, measured on quantized and pruned points)."""
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    points = accuracy_speed_points(results)
    if not points:
        return None
    variants = list(dict.fromkeys(p["variant"] for p in points))
    batches = sorted({p["batch_size"] for p in points})
    markers = dict(zip(batches, "osD^v<>p*h", strict=False))
    text = FIGURE_TEXT["accuracy_speed"]
    with figure_style(size):
        fig = new_figure(size)
        ax = fig.add_subplot(1, 1, 1)
        colours = dict(zip(variants, _run_colours(len(variants)), strict=True))
        for point in points:
            xy = (point["perplexity"], point["decode_tokens_per_s"])
            ax.plot([xy[0]], [xy[1]], marker=markers.get(point["batch_size"], "o"),
                    linestyle="none", color=colours[point["variant"]])
            ax.annotate(point["variant"], xy, textcoords="offset points", xytext=(3, 3),
                        fontsize="x-small", color=colours[point["variant"]])
        ax.set_xlabel(text.x)
        ax.set_ylabel(text.y)
        ax.set_yscale("log")
        ax.set_title(text.title + "\n" + figure_caption(results))
        ax.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color="#555555", marker=markers[b], linestyle="none",
                          label=f"batch {b}") for b in batches if b in markers]
        legend = ax.legend(handles=handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {"points": points, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}


def speculative_speedup_data(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The speed-up-against-k lines: per variant and batch size, measured and predicted
    (each with k and speedup lists), the variants and batch sizes in order, and the k values
    of each batch size; None when no result carries `metrics.speculative`."""
    from infbench.results.speculative import spec_rows

    rows = spec_rows(results)
    if not rows:
        return None
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    batches = list(dict.fromkeys(r["batch_size"] for r in rows))
    batches.sort(key=lambda b: (b is None, b or 0))
    lines: list[dict[str, Any]] = []
    for batch in batches:
        for variant in variants:
            pts = [r for r in rows if r["variant"] == variant and r["batch_size"] == batch
                   and r["num_tokens"] is not None]
            for kind in ("measured", "predicted"):
                xy = [(r["num_tokens"], r[f"speedup_{kind}"]) for r in pts
                      if r[f"speedup_{kind}"] is not None]
                if xy:
                    lines.append({"variant": variant, "batch_size": batch, "kind": kind,
                                  "k": [x for x, _ in xy], "speedup": [y for _, y in xy]})
    ks = {b: sorted({r["num_tokens"] for r in rows
                     if r["batch_size"] == b and r["num_tokens"] is not None}) for b in batches}
    return {"variants": variants, "batch_sizes": batches, "lines": lines, "ks": ks}


def speculative_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                       size: str = "column") -> dict[str, Any] | None:
    """x: draft tokens per step k; y: speed-up over plain decoding (baseline TPOT /
    speculative TPOT); one panel per batch size, one colour per variant, measured solid,
    predicted from the measured acceptance and draft cost dashed, a grey line at 1.0 (no
    gain).  None (nothing written) when no result carries `metrics.speculative`."""
    from matplotlib.lines import Line2D

    from infbench.plots.analytic import figure_style, new_figure, save_figure

    data = speculative_speedup_data(results)
    if data is None:
        return None
    variants, batches, lines = data["variants"], data["batch_sizes"], data["lines"]
    text = FIGURE_TEXT["speculative_speedup"]
    with figure_style(size):
        fig = new_figure(size)
        axes = fig.subplots(1, len(batches), sharey=True, squeeze=False)[0]
        colours = dict(zip(variants, _run_colours(len(variants)), strict=True))
        for ax, batch in zip(axes, batches, strict=True):
            ax.axhline(1.0, color="#888888", linewidth=0.8, zorder=0)
            for line in (x for x in lines if x["batch_size"] == batch):
                measured = line["kind"] == "measured"
                ax.plot(line["k"], line["speedup"], linestyle="-" if measured else "--",
                        marker="o" if measured else "", color=colours[line["variant"]])
            if data["ks"][batch]:
                ax.set_xticks(data["ks"][batch])
            ax.set_title("batch ?" if batch is None else f"batch {batch}", fontsize="small")
            ax.set_xlabel(text.x)
            ax.grid(True, which="major", alpha=0.3)
        axes[0].set_ylabel(text.y)
        fig.suptitle(text.title + "\n" + figure_caption(results))
        handles = [Line2D([], [], color=colours[v], linestyle="-", label=v)
                   for v in variants]
        handles += [Line2D([], [], color="#555555", marker="o", linestyle="-",
                           label="measured"),
                    Line2D([], [], color="#555555", linestyle="--", label="predicted")]
        legend = axes[0].legend(handles=handles, fontsize="x-small", loc="best")
        path = save_figure(fig, Path(out))
    return {"lines": lines, "batch_sizes": batches, "path": str(path), "figure": fig,
            "legend": [t.get_text() for t in legend.get_texts()]}
