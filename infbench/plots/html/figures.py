"""The report's interactive figures (plotly): one function per figure, each drawing the data
that `infbench plots` draws with matplotlib, from the same functions of `plots.measured` and
`plots.goodput` and `plots.rate` (`latency_throughput_data`, `itl_cdf_data`,
`measured_roofline_points`, `accuracy_speed_points`, `speculative_speedup_data`,
`goodput_rate_data`, `latency_rate_data`) and with the same titles (`FIGURE_TEXT`), so a
figure is defined once and drawn twice; the predicted-under-load series
(`prediction.metrics`) are dashed with open markers, as in the PNGs.  The figures the PNGs
do not have (per-point TTFT/TPOT CDFs, the request timeline, acceptance by position, MoE
routing per step, load over time) read their data from `plots.records`.

Each function returns a `Figure` (its element id, a caption and the plotly figure as JSON
data) or None when the results hold nothing to draw; `page` embeds them.  plotly builds and
validates every trace here (`plotly.graph_objects`); the page carries plotly.js itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infbench.plots.goodput import LATENCY_SERIES, STAT_MARKERS, goodput_rate_data
from infbench.plots.goodput import TEXT as GOODPUT_TEXT
from infbench.plots.measured import (
    FIGURE_TEXT,
    KIND_LINES,
    KIND_TEXT,
    LATENCY_THROUGHPUT_KINDS,
    METRIC_STYLES,
    RUN_COLOURS,
    _dtype,
    _result_hardware,
    accuracy_speed_points,
    cdf_text,
    figure_caption,
    itl_cdf_data,
    latency_throughput_data,
    measured_roofline_points,
    point_labels,
    speculative_speedup_data,
)
from infbench.plots.predicted import PREDICTED_LABEL
from infbench.plots.rate import METRICS as RATE_METRICS
from infbench.plots.rate import STAT_MARKERS as RATE_STAT_MARKERS
from infbench.plots.rate import TEXT as RATE_TEXT
from infbench.plots.rate import latency_rate_data
from infbench.plots.records import (
    MAX_TIMELINE_REQUESTS,
    acceptance_by_position,
    load_over_time,
    moe_steps,
    request_bars,
    request_latency_cdfs,
)

# plotly marker symbols for the matplotlib markers of METRIC_STYLES and the roofline
SYMBOLS = {"s": "square", "o": "circle", "^": "triangle-up", "D": "diamond"}
STAGE_SYMBOLS = {"prefill": "square", "decode": "circle", "diffusion": "triangle-up"}
STAGE_COLOURS = {"prefill": "#D55E00", "decode": "#0072B2", "diffusion": "#009E73"}
DASHES = {"-": "solid", "--": "dash", ":": "dot", "-.": "dashdot"}
MAX_LABELLED = 8  # a series with more points is labelled on hover only


@dataclass(frozen=True)
class Figure:
    """One drawn figure: the element id it gets, a one-line caption, the plotly JSON."""

    id: str
    caption: str
    data: dict[str, Any]


def colours(n: int) -> list[str]:
    """One CSS colour per series: Okabe-Ito up to 7 (as the PNGs), then evenly spaced hues."""
    if n <= len(RUN_COLOURS):
        return list(RUN_COLOURS[:n])
    return [f"hsl({int(360 * i / n)}, 65%, 45%)" for i in range(n)]


def _layout(title: str, caption: str, **kw: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": f"{title}<br><sup>{caption}</sup>" if caption else title,
                  "x": 0.01, "xanchor": "left"},
        "template": "plotly_white", "hovermode": "closest", "height": 420,
        "margin": {"l": 70, "r": 30, "t": 70, "b": 60},
        "legend": {"font": {"size": 11}},
    }
    layout.update(kw)
    return layout


def _finish(fig_id: str, caption: str, fig: Any) -> Figure:
    import plotly.io as pio

    return Figure(fig_id, caption, _json_loads(pio.to_json(fig, validate=False)))


def _json_loads(text: str) -> dict[str, Any]:
    import json

    data = json.loads(text)
    assert isinstance(data, dict)
    return data


def _num(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


# ------------------------------------------------------------------ the shared figures
def latency_throughput(results: list[dict[str, Any]]) -> Figure | None:
    """Output tok/s against TPOT p50 and TTFT p50: measured solid, the roofline's batch
    dotted, the simulation under load dashed (both predictions open markers)."""
    import plotly.graph_objects as go

    data = latency_throughput_data(results)
    if not any(data[kind] for kind in LATENCY_THROUGHPUT_KINDS):
        return None
    text = FIGURE_TEXT["latency_throughput"]
    fig = go.Figure()
    names = list(dict.fromkeys(str(d["name"]) for kind in LATENCY_THROUGHPUT_KINDS
                               for d in data[kind]))
    palette = dict(zip(names, colours(len(names)), strict=True))
    for kind in LATENCY_THROUGHPUT_KINDS:
        for name in names:
            pts = [d for d in data[kind] if str(d["name"]) == name]
            for key, metric, what in (("y", "tpot", "TPOT p50"), ("ttft_ms", "ttft", "TTFT p50")):
                xy = [d for d in pts if d[key] is not None]
                if not xy:
                    continue
                marker = METRIC_STYLES[metric][0]
                measured = kind == "measured"
                labelled = measured and len(xy) <= MAX_LABELLED  # else hover only
                fig.add_trace(go.Scatter(
                    x=[d["x"] for d in xy], y=[d[key] for d in xy],
                    mode="lines+markers+text" if labelled else "lines+markers",
                    text=[d["swept"] for d in xy] if labelled else None,
                    textposition="bottom right", textfont={"size": 10},
                    name=f"{what} {KIND_TEXT[kind]}" + (f" · {name}" if len(names) > 1 else ""),
                    legendgroup=f"{name} {metric}",
                    marker={"symbol": SYMBOLS[marker] + ("" if measured else "-open"),
                            "color": palette[name], "size": 9},
                    line={"dash": DASHES[KIND_LINES[kind]], "color": palette[name]},
                    opacity=0.6 if kind == "predicted" else 1.0,
                    customdata=[[d["swept"], d["batch_size"]] for d in xy],
                    hovertemplate=(f"<b>%{{customdata[0]}}</b> ({KIND_TEXT[kind]})<br>"
                                   f"{what}: %{{y:.3g}} ms<br>output: %{{x:.4g}} tok/s"
                                   "<extra></extra>")))
    fig.update_layout(**_layout(text.title, figure_caption(results)))
    fig.update_xaxes(title_text=text.x)
    fig.update_yaxes(title_text=text.y, type="log")
    return _finish("fig-latency-throughput", "TPOT p50 (circles) and TTFT p50 (squares) "
                   "against output throughput; solid: measured; open dotted: the roofline's "
                   f"prediction of one batch; open dashed: {PREDICTED_LABEL}, the point's "
                   "requests through the simulated engine.", fig)


def latency_rate(results: list[dict[str, Any]]) -> Figure | None:
    """TTFT and TPOT p50 / p90 against the request rate, measured and simulated."""
    from plotly.subplots import make_subplots

    data = latency_rate_data(results)
    if data is None:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[RATE_TEXT[m] for m, _ in RATE_METRICS])
    palette = dict(zip(data["keys"], colours(len(data["keys"])), strict=True))
    several = len(data["keys"]) > 1
    for line in data["lines"]:
        colour = palette[(line["name"], line["group"])]
        where = f" · {line['group']}" if several else ""
        for kind in ("measured", "predicted"):
            predicted = kind == "predicted"
            what = PREDICTED_LABEL if predicted else "measured"
            for row, (metric, name) in enumerate(RATE_METRICS, start=1):
                for stat, marker in RATE_STAT_MARKERS:
                    trace = _rate_series(line["x"], line["rates"],
                                         line[kind][f"{metric}_{stat}_ms"],
                                         f"{name} {stat} {what}{where}", SYMBOLS[marker], colour,
                                         "%{y:.3g} ms", predicted,
                                         legendgroup=f"{line['group']} {kind}")
                    if trace is not None:
                        fig.add_trace(trace, row=row, col=1)
    fig.update_layout(**_layout(RATE_TEXT["title"], figure_caption(results), height=560))
    for row, (metric, _) in enumerate(RATE_METRICS, start=1):
        fig.update_yaxes(title_text=RATE_TEXT[metric], type="log", row=row, col=1)
    fig.update_xaxes(title_text=RATE_TEXT["rate"], tickvals=data["ticks"],
                     ticktext=data["tick_text"], row=2, col=1)
    return _finish("fig-latency-rate", "p50 (circles) and p90 (triangles); solid: measured; "
                   f"open dashed: {PREDICTED_LABEL}, the point's requests through the "
                   "simulated engine.", fig)


def latency_cdfs(results: list[dict[str, Any]]) -> Figure | None:
    """TTFT, TPOT and ITL CDFs per point (per-request samples); without per-request rows
    the ITL panel shows decode-step times, as `infbench plots` does."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = point_labels(results)
    itl = itl_cdf_data(results)
    per_point = [request_latency_cdfs(r) for r in results]
    if not any(c["x"] for c in itl.values()) and not any(per_point):
        return None
    itl_text = cdf_text({series["source"] for series in itl.values()})
    panels = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", itl_text.x))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels],
                        horizontal_spacing=0.07)
    palette = colours(len(results))
    for i, (label, samples) in enumerate(zip(labels, per_point, strict=True)):
        for col, (metric, _) in enumerate(panels, start=1):
            series = itl[label] if metric == "itl" else samples.get(metric)
            if not series or not series["x"]:
                continue
            fig.add_trace(go.Scatter(
                x=series["x"], y=series["y"], mode="lines+markers",
                line={"shape": "hv", "color": palette[i]}, marker={"size": 4},
                name=label, legendgroup=label, showlegend=col == 1 or metric == "itl" and
                not samples,
                hovertemplate=f"{label}<br>%{{x:.3g}} ms: %{{y:.0%}} at or below<extra></extra>"),
                row=1, col=col)
    fig.update_layout(**_layout("Latency distributions (CDF per point)", figure_caption(results),
                                height=400))
    for col in (1, 2, 3):
        fig.update_xaxes(type="log", row=1, col=col)
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=col)
    fig.update_yaxes(title_text="fraction at or below", row=1, col=1)
    return _finish("fig-latency-cdfs", "Per request (TTFT, TPOT) and per token (ITL) of the "
                   "last repeat; the table above is the median over the repeats. Click a point "
                   "in the legend to hide it, double-click to show it alone.", fig)


def roofline(results: list[dict[str, Any]]) -> Figure | None:
    """The measured roofline: each stage measured (filled) beside its prediction (hollow),
    joined by a dashed line, under the roof of the results' hardware; every step too,
    hidden until its legend entry is clicked."""
    import plotly.graph_objects as go

    from infbench.plots.analytic import roof_curve

    engine = [r for r in results if r.get("hardware") or not (r.get("scenario") or {})
              .get("target")]
    if not engine:
        return None
    hw = _result_hardware(engine[0])
    dtype = _dtype(engine[0])
    points = [p for p in measured_roofline_points(engine, hw, include_steps=True)
              if p.intensity > 0 and p.flops_per_s > 0]
    if not points:
        return None
    peak, bw, ridge, grid, roof = roof_curve(hw, dtype, [p.intensity for p in points])
    text = FIGURE_TEXT["roofline"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid, y=roof, mode="lines", line={"color": "black"},
                             name=f"roof: {hw.name}", hovertemplate=(
                                 "%{x:.3g} FLOP/B: %{y:.3g} FLOP/s attainable<extra></extra>")))
    fig.add_trace(go.Scatter(x=[ridge], y=[peak], mode="markers+text",
                             marker={"symbol": "diamond", "color": "#D55E00", "size": 9},
                             text=[f"ridge {ridge:.0f} FLOP/B"], textposition="top center",
                             name="ridge point", hovertemplate=(
                                 f"ridge {ridge:.3g} FLOP/B<br>peak {peak:.3g} FLOP/s<br>"
                                 f"bandwidth {bw:.3g} B/s<extra></extra>")))
    twins = {p.group: p for p in points if p.kind == "predicted" and p.group}
    lx: list[float | None] = []
    ly: list[float | None] = []
    for p in points:
        twin = twins.get(p.group) if p.kind == "measured" and p.group else None
        if twin is not None:
            lx += [twin.intensity, p.intensity, None]
            ly += [twin.flops_per_s, p.flops_per_s, None]
    if lx:
        fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", name="measured ↔ predicted",
                                 line={"dash": "dash", "color": "grey", "width": 1},
                                 hoverinfo="skip"))
    for stage in STAGE_SYMBOLS:
        for kind in ("measured", "predicted", "step"):
            pts = [p for p in points if p.stage == stage and
                   (p.kind == kind if kind != "step" else (p.kind == "measured" and not p.group))
                   and (kind == "step" or p.group)]
            if not pts:
                continue
            symbol = STAGE_SYMBOLS[stage] + ("-open" if kind == "predicted" else "")
            fig.add_trace(go.Scatter(
                x=[p.intensity for p in pts], y=[p.flops_per_s for p in pts], mode="markers",
                name=f"{stage} {kind}" + (" (every step)" if kind == "step" else ""),
                visible="legendonly" if kind == "step" else True,
                marker={"symbol": symbol, "color": STAGE_COLOURS[stage],
                        "size": 5 if kind == "step" else 10,
                        "opacity": 0.4 if kind == "step" else 0.9},
                text=[p.label for p in pts],
                hovertemplate=("<b>%{text}</b><br>%{x:.3g} FLOP/B<br>%{y:.3g} FLOP/s"
                               "<extra></extra>")))
    fig.update_layout(**_layout(text.title, figure_caption(engine, hw)))
    fig.update_xaxes(title_text=text.x, type="log")
    fig.update_yaxes(title_text=text.y, type="log")
    return _finish("fig-roofline", f"{hw.name}: peak {peak:.3g} FLOP/s ({dtype}), bandwidth "
                   f"{bw:.3g} B/s; filled measured, hollow predicted; click “every step” in "
                   "the legend to show each engine step.", fig)


def accuracy_speed(results: list[dict[str, Any]]) -> Figure | None:
    """Decode tok/s against perplexity, one colour per variant, one symbol per batch."""
    import plotly.graph_objects as go

    points = accuracy_speed_points(results)
    if not points:
        return None
    text = FIGURE_TEXT["accuracy_speed"]
    variants = list(dict.fromkeys(p["variant"] for p in points))
    batches = sorted({p["batch_size"] for p in points})
    symbols = dict(zip(batches, ("circle", "square", "diamond", "triangle-up",
                                 "triangle-down", "cross", "x", "star"), strict=False))
    palette = dict(zip(variants, colours(len(variants)), strict=True))
    fig = go.Figure()
    for variant in variants:
        pts = [p for p in points if p["variant"] == variant]
        fig.add_trace(go.Scatter(
            x=[p["perplexity"] for p in pts], y=[p["decode_tokens_per_s"] for p in pts],
            mode="markers+text", text=[variant] * len(pts), textposition="top right",
            name=variant, marker={"color": palette[variant], "size": 11,
                                  "symbol": [symbols.get(p["batch_size"], "circle")
                                             for p in pts]},
            customdata=[p["batch_size"] for p in pts],
            hovertemplate=(f"<b>{variant}</b>, batch %{{customdata}}<br>perplexity %{{x:.4g}}"
                           "<br>decode %{y:.4g} tok/s<extra></extra>")))
    fig.update_layout(**_layout(text.title, figure_caption(results)))
    fig.update_xaxes(title_text=text.x)
    fig.update_yaxes(title_text=text.y, type="log")
    shapes = ", ".join(f"batch {b}: {symbols[b]}" for b in batches if b in symbols)
    return _finish("fig-accuracy-speed", f"One colour per variant; symbol by batch ({shapes}).",
                   fig)


def speculative_speedup(results: list[dict[str, Any]]) -> Figure | None:
    """Speed-up over plain decoding against k, a panel per batch size."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    data = speculative_speedup_data(results)
    if data is None or not data["lines"]:
        return None
    text = FIGURE_TEXT["speculative_speedup"]
    batches = data["batch_sizes"]
    fig = make_subplots(rows=1, cols=len(batches), shared_yaxes=True,
                        subplot_titles=["batch ?" if b is None else f"batch {b}"
                                        for b in batches])
    palette = dict(zip(data["variants"], colours(len(data["variants"])), strict=True))
    shown: set[tuple[str, str]] = set()
    for col, batch in enumerate(batches, start=1):
        fig.add_hline(y=1.0, line={"color": "#888888", "width": 1}, row=1, col=col)
        for line in (x for x in data["lines"] if x["batch_size"] == batch):
            measured = line["kind"] == "measured"
            key = (line["variant"], line["kind"])
            fig.add_trace(go.Scatter(
                x=line["k"], y=line["speedup"], mode="lines+markers" if measured else "lines",
                name=f"{line['variant']} {line['kind']}", legendgroup=line["variant"],
                showlegend=key not in shown,
                line={"color": palette[line["variant"]], "dash": "solid" if measured else "dash"},
                hovertemplate=(f"{line['variant']} ({line['kind']}), batch {batch}<br>k %{{x}}: "
                               "%{y:.3f}x<extra></extra>")), row=1, col=col)
            shown.add(key)
        fig.update_xaxes(title_text=text.x, tickvals=data["ks"][batch], row=1, col=col)
    fig.update_layout(**_layout(text.title, figure_caption(results)))
    fig.update_yaxes(title_text=text.y, row=1, col=1)
    return _finish("fig-spec-speedup", "Solid: measured (plain TPOT / speculative TPOT); "
                   "dashed: predicted from the measured acceptance and draft cost; grey: 1.0, "
                   "no gain.", fig)


def goodput_rate(results: list[dict[str, Any]]) -> Figure | None:
    """Latency and goodput against the request rate, the objectives and the SLO max rate."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    data = goodput_rate_data(results)
    if data is None:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        specs=[[{}], [{"secondary_y": True}]])
    palette = dict(zip(data["keys"], colours(len(data["keys"])), strict=True))
    for line in data["lines"]:
        key = (line["name"], line["group"])
        group = "" if line["group"] == "default" else f" [{line['group']}]"
        for kind, values in (("measured", line), ("predicted", line["predicted"])):
            predicted = kind == "predicted"
            what = f" {PREDICTED_LABEL}" if predicted else ""
            at = (line["x"], line["rates"])
            for metric, name, colour in LATENCY_SERIES:
                for stat, marker in STAT_MARKERS:
                    trace = _rate_series(*at, values[f"{metric}_{stat}_ms"],
                                         f"{name} {stat}{what}{group}", SYMBOLS[marker],
                                         colour, "%{y:.3g} ms", predicted)
                    if trace is not None:
                        fig.add_trace(trace, row=1, col=1)
            trace = _rate_series(*at, values["goodput"], f"goodput{what}{group}", "square",
                                 palette[key], "%{y:.3g} req/s", predicted)
            if trace is not None:
                fig.add_trace(trace, row=2, col=1)
            trace = _rate_series(*at, values["slo_attainment"], f"within SLO{what}{group}",
                                 "triangle-up", palette[key], "%{y:.0%}", predicted,
                                 dash="dot", opacity=0.7)
            if trace is not None:
                fig.add_trace(trace, row=2, col=1, secondary_y=True)
        for rate, predicted in ((line["max_rate"], False), (line["predicted_max_rate"], True)):
            if rate is None:
                continue
            x = data["x_of"][rate]
            fig.add_vline(x=x, line={"color": palette[key], "width": 1,
                                     "dash": "dash" if predicted else "solid"}, row=2, col=1)
            fig.add_annotation(x=x, y=1.0, yref="y3 domain", xref="x2", showarrow=False,
                               text=(f"{'predicted ' if predicted else ''}SLO max rate "
                                     f"{_rate(rate)} req/s"), yanchor="top" if predicted
                               else "bottom", font={"size": 11})
    xs = [x for line in data["lines"] for x in line["x"]]
    for metric, name, colour in LATENCY_SERIES:
        if f"{metric}_ms" in data["slo"]:  # a trace, not a shape: it gets a legend entry
            objective = data["slo"][f"{metric}_ms"]
            fig.add_trace(go.Scatter(
                x=[min(xs), max(xs)], y=[objective, objective], mode="lines",
                name=f"{name} objective {objective:g} ms",
                line={"color": colour, "dash": "longdash", "width": 1}, opacity=0.7,
                hovertemplate=f"{name} objective: {objective:g} ms<extra></extra>"),
                row=1, col=1)
    fig.add_hline(y=data["target"], line={"color": "#888888", "dash": "dot", "width": 1},
                  row=2, col=1, secondary_y=True)
    fig.update_layout(**_layout(GOODPUT_TEXT["title"], figure_caption(results), height=560))
    fig.update_yaxes(title_text=GOODPUT_TEXT["latency"], type="log", row=1, col=1)
    fig.update_yaxes(title_text=GOODPUT_TEXT["goodput"], row=2, col=1, secondary_y=False)
    fig.update_yaxes(title_text=GOODPUT_TEXT["attainment"], range=[0, 1.05], tickformat=".0%",
                     row=2, col=1, secondary_y=True)
    fig.update_xaxes(title_text=GOODPUT_TEXT["rate"], tickvals=data["ticks"],
                     ticktext=data["tick_text"], row=2, col=1)
    note = (f" Open markers, dashed: {PREDICTED_LABEL} (its SLO max rate a dashed vertical "
            "line)." if data["has_predicted"] else "")
    return _finish("fig-goodput-rate", "p50 circles, p99 triangles; dashed horizontal lines: "
                   "the objectives and the target fraction; the vertical line marks the SLO "
                   "max rate." + note, fig)


def _rate_series(xs: list[float], rates: list[float], ys: list[float | None], name: str,
                 symbol: str, colour: str, hover: str, predicted: bool, dash: str = "solid",
                 **kw: Any) -> Any:
    """One series against the rate: measured solid (or `dash`) with filled markers,
    predicted dashed with open ones; the points without a value are left out, and a series
    with none is None (no empty legend entry)."""
    import plotly.graph_objects as go

    pts = [(x, y, r) for x, y, r in zip(xs, map(_num, ys), rates, strict=True) if y is not None]
    if not pts:
        return None
    return go.Scatter(
        x=[x for x, _, _ in pts], y=[y for _, y, _ in pts], mode="lines+markers", name=name,
        marker={"color": colour, "symbol": symbol + ("-open" if predicted else ""), "size": 8},
        line={"color": colour, "dash": "dash" if predicted else dash},
        customdata=[_rate(r) for _, _, r in pts],
        hovertemplate=f"{name} at %{{customdata}} req/s: {hover}<extra></extra>", **kw)


def _rate(rate: float | None) -> str:
    from infbench.results.goodput import rate_text

    return rate_text(rate)


# ------------------------------------------------------------------ the report's own figures
def request_timeline(result: dict[str, Any], label: str, index: int) -> Figure | None:
    """One bar per request: arrival -> first token (queue + prefill), first token -> finish
    (decode), preempted requests marked; hover for each request's numbers."""
    import plotly.graph_objects as go

    bars = request_bars(result)
    if not bars["rows"]:
        return None
    rows = bars["rows"]
    ids = [row["id"] for row in rows]
    hover = [[row["id"], row["arrival_ms"], row["ttft_ms"], row["e2e_ms"],
              row["num_prompt_tokens"], row["num_output_tokens"], row["num_preemptions"],
              row["finish_reason"]] for row in rows]
    template = ("<b>%{customdata[0]}</b><br>arrival %{customdata[1]:.1f} ms<br>"
                "TTFT %{customdata[2]:.1f} ms<br>E2E %{customdata[3]:.1f} ms<br>"
                "tokens: %{customdata[4]} prompt, %{customdata[5]} output<br>"
                "preemptions %{customdata[6]}<br>finish: %{customdata[7]}<extra>%{fullData.name}"
                "</extra>")
    fig = go.Figure()
    fig.add_trace(go.Bar(y=ids, base=[row["arrival_ms"] for row in rows],
                         x=[row["ttft_ms"] for row in rows], orientation="h",
                         name="queued + prefill (arrival → first token)",
                         marker={"color": "#E69F00"}, customdata=hover,
                         hovertemplate=template))
    fig.add_trace(go.Bar(y=ids, base=[row["first_token_ms"] for row in rows],
                         x=[row["decode_ms"] for row in rows], orientation="h",
                         name="decode (first token → finish)", marker={"color": "#0072B2"},
                         customdata=hover, hovertemplate=template))
    preempted = [row for row in rows if row["num_preemptions"]]
    if preempted:
        fig.add_trace(go.Scatter(
            y=[row["id"] for row in preempted], x=[row["finish_ms"] for row in preempted],
            mode="markers", marker={"symbol": "x", "color": "#CC0000", "size": 9},
            name="preempted (at least once)",
            customdata=[hover[rows.index(row)] for row in preempted], hovertemplate=template))
    fig.update_layout(**_layout(f"Request timeline: {label}", figure_caption([result]),
                                barmode="overlay", bargap=0.25,
                                height=min(900, max(230, 150 + 16 * len(rows)))))
    fig.update_xaxes(title_text="time since the run started (ms)")
    fig.update_yaxes(title_text="request", autorange="reversed", type="category",
                     showticklabels=len(rows) <= 40)
    shown = (f"the first {len(rows)} of {bars['num_requests']} requests"
             if bars["num_requests"] > len(rows) else f"{len(rows)} requests")
    return _finish(f"fig-timeline-{index}", f"{shown} of the last repeat; hover a bar for the "
                   f"request's numbers (at most {MAX_TIMELINE_REQUESTS} drawn).", fig)


def spec_acceptance(results: list[dict[str, Any]]) -> Figure | None:
    """The fraction of drafts accepted at each draft position, one line per point."""
    import plotly.graph_objects as go

    lines = acceptance_by_position(results)
    if not lines:
        return None
    fig = go.Figure()
    palette = colours(len(lines))
    for line, colour in zip(lines, palette, strict=True):
        fig.add_trace(go.Scatter(
            x=line["position"], y=line["acceptance"], mode="lines+markers", name=line["label"],
            line={"color": colour},
            hovertemplate=(f"{line['label']}<br>position %{{x}}: %{{y:.1%}} accepted"
                           "<extra></extra>")))
    fig.update_layout(**_layout("Speculative acceptance by draft position",
                                figure_caption(results)))
    fig.update_xaxes(title_text="draft position (1 = first drafted token)", dtick=1)
    fig.update_yaxes(title_text="accepted (fraction of drafts)", range=[0, 1.05],
                     tickformat=".0%")
    return _finish("fig-spec-acceptance", "A draft token is accepted only when every token "
                   "before it was.", fig)


def moe_routing(results: list[dict[str, Any]]) -> Figure | None:
    """Per step: routed experts touched beside uniform routing's, and the routing skew."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series = moe_steps(results)
    if not series:
        return None
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=[
        "experts touched per step (solid) vs uniform routing (dotted)",
        "skew: max / mean tokens per expert"])
    palette = colours(len(series))
    for s, colour in zip(series, palette, strict=True):
        fig.add_trace(go.Scatter(x=s["step"], y=s["experts_touched"], mode="lines+markers",
                                 name=s["label"], legendgroup=s["label"],
                                 line={"color": colour}, marker={"size": 4},
                                 hovertemplate=(f"{s['label']}<br>step %{{x}}: %{{y}} experts"
                                                "<extra></extra>")), row=1, col=1)
        fig.add_trace(go.Scatter(x=s["step"], y=s["expected_experts"], mode="lines",
                                 name=f"{s['label']} uniform", legendgroup=s["label"],
                                 showlegend=False, line={"color": colour, "dash": "dot"},
                                 hovertemplate=(f"{s['label']} uniform<br>step %{{x}}: "
                                                "%{y:.2f} experts<extra></extra>")),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=s["step"], y=s["max_over_mean"], mode="lines+markers",
                                 name=s["label"], legendgroup=s["label"], showlegend=False,
                                 line={"color": colour}, marker={"size": 4},
                                 hovertemplate=(f"{s['label']}<br>step %{{x}}: max/mean "
                                                "%{y:.2f}<extra></extra>")), row=1, col=2)
    fig.update_layout(**_layout("MoE routing per engine step", figure_caption(results)))
    fig.update_xaxes(title_text="engine step")
    return _finish("fig-moe", "Summed over the MoE layers; a skew of 1 is perfectly even "
                   "routing.", fig)


def load(results: list[dict[str, Any]]) -> Figure | None:
    """Requests in flight, KV blocks in use (engine runs) and output tokens/s over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series = [(label, s) for label, s in zip(point_labels(results),
                                             (load_over_time(r) for r in results), strict=True)
              if s is not None]
    if not series:
        return None
    has_kv = any(s["kv_used_pct"] for _, s in series)
    titles = ["requests in flight (running + waiting)", "output tokens/s"]
    if has_kv:
        titles.insert(1, "KV cache blocks in use (%)")
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=titles)
    palette = colours(len(series))
    for (label, s), colour in zip(series, palette, strict=True):
        common = {"legendgroup": label, "line": {"color": colour, "shape": "hv"}}
        fig.add_trace(go.Scatter(x=s["t_s"], y=s["in_flight"], mode="lines", name=label,
                                 hovertemplate=(f"{label}<br>%{{x:.3f}} s: %{{y}} in flight"
                                                "<extra></extra>"), **common), row=1, col=1)
        if has_kv and s["kv_used_pct"]:
            fig.add_trace(go.Scatter(x=s["t_s"], y=s["kv_used_pct"], mode="lines", name=label,
                                     showlegend=False, hovertemplate=(
                                         f"{label}<br>%{{x:.3f}} s: %{{y:.1f}}% of KV blocks"
                                         "<extra></extra>"), **common), row=2, col=1)
        fig.add_trace(go.Scatter(x=s["tokens_t_s"], y=s["tokens_per_s"], mode="lines",
                                 name=label, showlegend=False, hovertemplate=(
                                     f"{label}<br>%{{x:.3f}} s: %{{y:.4g}} tok/s"
                                     "<extra></extra>"), **common), row=len(titles), col=1)
    fig.update_layout(**_layout("Load over time", figure_caption(results),
                                height=200 + 170 * len(titles)))
    fig.update_xaxes(title_text="time since the run started (s)", row=len(titles), col=1)
    source = ("the engine's steps where the result has them, else the client's request records"
              if any(s["source"] == "steps" for _, s in series) else
              "the client's request records (the server's own /metrics are not recorded)")
    return _finish("fig-load", f"From {source}; the last repeat of each point.", fig)


def comparison(rows: list[dict[str, Any]], threshold_pct: float) -> Figure | None:
    """Each metric's change (new vs baseline, %), with the repeats' spread as error bars
    and the gate's threshold as a band; better is always up (lower-is-better metrics
    are drawn with the sign flipped)."""
    import plotly.graph_objects as go

    if not rows:
        return None
    points = list(dict.fromkeys(r["point"] for r in rows))
    palette = dict(zip(points, colours(len(points)), strict=True))
    fig = go.Figure()
    for point in points:
        mine = [r for r in rows if r["point"] == point]
        fig.add_trace(go.Bar(
            x=[r["metric"] for r in mine], y=[r["better_pct"] for r in mine], name=point,
            marker={"color": palette[point]},
            error_y={"type": "data", "symmetric": True,
                     "array": [r["noise_pct"] or 0.0 for r in mine], "visible": True},
            customdata=[[r["baseline"], r["new"], r["change_pct"], r["status"],
                         r["noise_pct"] or 0.0] for r in mine],
            hovertemplate=("<b>%{x}</b> (" + point + ")<br>baseline %{customdata[0]:.4g}<br>"
                           "new %{customdata[1]:.4g}<br>change %{customdata[2]:+.1f}%<br>"
                           "repeats spread ±%{customdata[4]:.1f}%<br>%{customdata[3]}"
                           "<extra></extra>")))
    fig.add_hrect(y0=-threshold_pct, y1=threshold_pct, fillcolor="#888888", opacity=0.15,
                  line_width=0)
    fig.update_layout(**_layout("Change per metric (up is better)", "new against baseline",
                                barmode="group"))
    # The changes set the scale; an error bar of a noisy metric runs off it (zoom out to see)
    top = max([abs(r["better_pct"]) for r in rows] + [2 * threshold_pct]) * 1.2
    fig.update_yaxes(title_text="improvement (%)", zeroline=True, range=[-top, top])
    return _finish("fig-compare", f"Grey band: ±{threshold_pct:g}%, the gate's threshold; "
                   "error bars: the repeats' spread (min..max) of both sides, relative to "
                   "the baseline.", fig)
