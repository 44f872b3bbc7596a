"""Figures from measured result files: measured roofline, latency-throughput, distributions.

Each figure function writes a PNG (matplotlib's Agg backend, imported lazily) and
returns the coordinates it plotted, so tests check values rather than pixels.

- `measured_roofline_points`: every run's prefill and decode stage at (measured
  arithmetic intensity, achieved FLOP/s) next to its predicted twin at (predicted
  intensity, predicted FLOP/s = predicted step FLOPs / predicted step time), the pair in
  one group (joined by a line) and each run in one series (one colour);
  `infbench.plots.roofline_figure` draws them against the roof.
- `latency_throughput_figure`: output tok/s against TPOT p50, one point per batch
  size: batching buys throughput with per-token latency (and the roofline says
  why: decode stays bandwidth-bound while the weights are shared by more tokens).
- `distributions_figure`: result files keep percentiles, not per-request samples,
  so ITL is shown as the CDF of decode-step durations (every running sequence gets
  one token per decode step) and TTFT / TPOT as their p50 / p90 / p99.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from infbench.core.errors import ResultSchemaError, UserError
from infbench.core.hardware import HardwareSpec
from infbench.results.accessor import metric as result_metric
from infbench.results.accessor import scenario_number, value_at
from infbench.roofline.tables import RooflinePoint

_STAGES = ("prefill", "decode")


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
    from infbench.core.hardware import get_hardware

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


def measured_roofline_figure(results: list[dict[str, Any]], out: str | os.PathLike[str],
                             hardware: HardwareSpec | None = None, include_steps: bool = False,
                             title: str | None = None) -> dict[str, Any]:
    """The measured roofline PNG; returns roofline_figure's dict (plotted points, links)."""
    from infbench.plots.analytic import roofline_figure

    hw = _hardware(results, hardware)
    dtype = _dtype(results[0])
    points = measured_roofline_points(results, hw, include_steps)
    return roofline_figure(hw, dtype, points, Path(out),
                           title=title or f"measured vs predicted on {hw.name} ({dtype})")


def _figure(ncols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    """An Agg figure without pyplot (no global state, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols)


def latency_throughput_figure(results: list[dict[str, Any]],
                              out: str | os.PathLike[str]) -> dict[str, Any]:
    """x: output tok/s, y: TPOT p50 ms; one labelled point per batch size, per scenario."""
    measured: list[dict[str, Any]] = []
    predicted: list[dict[str, Any]] = []
    for r in results:
        bs = scenario_number(r, "workload.batch_size")
        base = {"name": r.get("name"), "label": r.get("label"),
                "batch_size": None if bs is None else int(bs)}
        x, y = result_metric(r, "output_tokens_per_s"), result_metric(r, "tpot_s.p50")
        if x is not None and y is not None:
            measured.append({**base, "x": x, "y": y * 1e3})
        px, py = (result_metric(r, "prediction.output_tokens_per_s"),
                  result_metric(r, "prediction.tpot_s"))
        if px is not None and py is not None:
            predicted.append({**base, "x": px, "y": py * 1e3})
    key = lambda d: (str(d["name"]), d["batch_size"] if d["batch_size"] is not None else -1)
    measured.sort(key=key)
    predicted.sort(key=key)
    fig, ax = _figure(1, (7.0, 5.0))
    for series, kind, style in ((measured, "measured", "o-"), (predicted, "predicted", "s--")):
        for name in dict.fromkeys(str(d["name"]) for d in series):
            pts = [d for d in series if str(d["name"]) == name]
            ax.plot([d["x"] for d in pts], [d["y"] for d in pts], style,
                    label=f"{name} ({kind})", alpha=1.0 if kind == "measured" else 0.6)
            if kind == "measured":
                for d in pts:
                    text = f"bs={d['batch_size']}" if d["batch_size"] is not None else d["label"]
                    ax.annotate(text, (d["x"], d["y"]), textcoords="offset points",
                                xytext=(5, 5), fontsize=8)
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("TPOT p50 (ms)")
    ax.set_title("latency-throughput trade-off (one point per batch size)")
    ax.grid(True, alpha=0.3)
    if measured or predicted:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    return {"measured": measured, "predicted": predicted, "path": str(out)}


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


def distributions_figure(results: list[dict[str, Any]],
                         out: str | os.PathLike[str]) -> dict[str, Any]:
    """Left: CDF of decode-step durations (~ITL); right: TTFT and TPOT p50/p90/p99."""
    fig, (ax_cdf, ax_pct) = _figure(2, (11.0, 4.5))
    itl: dict[str, dict[str, list[float]]] = {}
    pct: dict[str, dict[str, dict[str, float | None]]] = {}
    labels = point_labels(results)
    for r, label in zip(results, labels, strict=True):
        xs = decode_step_ms(r)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        itl[label] = {"x": xs, "y": ys}
        if xs:
            ax_cdf.step(xs, ys, where="post", label=label)
        pct[label] = {
            f"{name}_ms": {q: (None if (v := result_metric(r, f"{name}_s.{q}")) is None
                               else v * 1e3)
                           for q in ("p50", "p90", "p99")}
            for name in ("ttft", "tpot")}
    ax_cdf.set_xlabel("decode step duration (ms) ~ inter-token latency")
    ax_cdf.set_ylabel("fraction of decode steps")
    ax_cdf.set_title("ITL distribution")
    ax_cdf.grid(True, alpha=0.3)
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        for j, (metric, marker) in enumerate((("ttft_ms", "o"), ("tpot_ms", "s"))):
            qs = pct[label][metric]
            xs_q = [k * 2 + j + i * width for k in range(3)]
            ys_q = [qs[q] for q in ("p50", "p90", "p99")]
            ax_pct.scatter([x for x, y in zip(xs_q, ys_q, strict=True) if y is not None],
                           [y for y in ys_q if y is not None], marker=marker,
                           label=f"{label} {metric[:4].upper()}")
    ax_pct.set_xticks([0.5, 2.5, 4.5], ["p50", "p90", "p99"])
    ax_pct.set_yscale("log")
    ax_pct.set_ylabel("ms (TTFT: circles, TPOT: squares)")
    ax_pct.set_title("TTFT and TPOT percentiles")
    ax_pct.grid(True, alpha=0.3)
    for ax in (ax_cdf, ax_pct):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    return {"itl_cdf": itl, "percentiles": pct, "path": str(out)}
