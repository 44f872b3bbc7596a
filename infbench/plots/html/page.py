"""One self-contained HTML page per run, sweep or comparison (`report --html`, `compare
--html`).

The page is a single file: the style sheet, plotly.js (the copy the plotly package ships,
`plotly.offline.get_plotlyjs`) and every figure's data are inline, no font is loaded (the
system's sans-serif), and nothing is fetched when it is opened, from `file://` or as a CI
artifact.  Tables are plain HTML, so they read with JavaScript off; figures are drawn by
plotly.js into their `<div>` (hover for values, drag to zoom, click a legend entry to hide
a series).  A section appears only when the results hold its data; `Section.id` is the
anchor the table of contents and the browser test use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from infbench.core.io import write_text_atomic
from infbench.plots.html import figures as figs
from infbench.plots.html import tables
from infbench.plots.html.figures import Figure
from infbench.plots.measured import point_labels

MAX_TIMELINES = 12  # one request timeline per point, for the first points of a long sweep


@dataclass
class Section:
    """One part of the page: an anchor id, a heading, HTML (tables, notes) and figures."""

    id: str
    title: str
    html: str = ""
    figures: list[Figure] = field(default_factory=list)


def _section(sections: list[Section], id: str, title: str, html: str = "",
             figures: Sequence[Figure | None] = ()) -> None:
    drawn = [f for f in figures if f is not None]
    if html or drawn:
        sections.append(Section(id, title, html, drawn))


# ------------------------------------------------------------------ a run or a sweep
def run_sections(results: list[dict[str, Any]]) -> list[Section]:
    """The sections of a run's page, in reading order, each only where it has data."""
    from infbench.results.goodput import goodput_rows, max_rate_line, max_rate_summaries
    from infbench.results.moe import moe_rows
    from infbench.results.speculative import spec_rows
    from infbench.results.variants import variant_rows

    sections: list[Section] = []
    _section(sections, "run", "Run", tables.run_cards(results))
    _section(sections, "points", "Measured against predicted",
             tables.points_table(results)
             + tables.notes(tables.noise_notes(results), what="noise and profile notes"))
    _section(sections, "latency-throughput", "Latency against throughput",
             figures=[figs.latency_throughput(results)])
    _section(sections, "latency-rate", "Latency against request rate",
             figures=[figs.latency_rate(results)])
    _section(sections, "distributions", "Latency distributions",
             tables.percentiles_table(results), [figs.latency_cdfs(results)])
    timelines = [figs.request_timeline(r, label, i) for i, (r, label) in
                 enumerate(zip(results[:MAX_TIMELINES], point_labels(results)[:MAX_TIMELINES],
                               strict=True))]
    skipped = len(results) - MAX_TIMELINES
    _section(sections, "timeline", "Requests over time",
             tables.notes([f"timelines of the first {MAX_TIMELINES} points; {skipped} more "
                           "point(s) not drawn"]) if skipped > 0 and any(timelines) else "",
             timelines)
    _section(sections, "roofline", "Measured roofline", figures=[figs.roofline(results)])
    variants = variant_rows(results)
    if variants:
        _section(sections, "variants", "Variants: speed beside accuracy",
                 tables.variants_table(variants), [figs.accuracy_speed(results)])
    spec = spec_rows(results)
    if spec:
        _section(sections, "speculative", "Speculative decoding", tables.spec_table(spec),
                 [figs.spec_acceptance(results), figs.speculative_speedup(results)])
    moe = moe_rows(results)
    if moe:
        _section(sections, "moe", "MoE routing", tables.moe_table(moe),
                 [figs.moe_routing(results)])
    goodput = goodput_rows(results)
    if goodput:
        lines = [max_rate_line(s) for s in max_rate_summaries(results)]
        _section(sections, "goodput", "Goodput against request rate",
                 tables.goodput_table(goodput) + tables.notes(lines, "verdict"),
                 [figs.goodput_rate(results)])
    _section(sections, "load", "Load over time", figures=[figs.load(results)])
    return sections


def run_title(results: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(str(r.get("name")) for r in results))
    what = names[0] if len(names) == 1 else f"{len(names)} scenarios"
    return f"infbench report: {what} ({len(results)} point{'s' * (len(results) != 1)})"


def write_run_report(results: list[dict[str, Any]], path: Path) -> int:
    """Write the run's page to `path`; returns its size in bytes."""
    return _write(path, run_title(results), run_sections(results))


# ------------------------------------------------------------------ a comparison
def compare_sections(baselines: list[dict[str, Any]], news: list[dict[str, Any]],
                     gate: Any) -> list[Section]:
    """The verdict, each metric's change, then both runs' cards and points tables."""
    from infbench.results.changes import metric_changes

    rows, change_notes = metric_changes(baselines, news, gate)
    verdict = ("PASS" if gate.passed else "FAIL: regression beyond threshold")
    mode = "" if gate.normalize == "none" else f", normalized: {gate.normalize}"
    head = (f'<p class="verdict {"pass" if gate.passed else "fail"}">gate {escape(verdict)} '
            f"(exit {gate.exit_code}): {escape(gate.metric)}, max regression "
            f"{gate.max_regression * 100:g}%{escape(mode)}</p>")
    sections: list[Section] = []
    _section(sections, "verdict", "Verdict",
             head + tables.change_table(rows) + tables.notes(gate.notes + change_notes),
             [figs.comparison(rows, gate.max_regression * 100)])
    _section(sections, "baseline", "Baseline",
             tables.run_cards(baselines) + tables.points_table(baselines))
    _section(sections, "new", "New", tables.run_cards(news) + tables.points_table(news)
             + tables.notes(tables.noise_notes(news), what="noise and profile notes"))
    _section(sections, "latency-throughput", "Latency against throughput",
             figures=[figs.latency_throughput(_tagged(baselines, "baseline")
                                              + _tagged(news, "new"))])
    return sections


def _tagged(results: list[dict[str, Any]], side: str) -> list[dict[str, Any]]:
    """Copies named `side: name`, so one figure tells baseline from new by colour."""
    return [{**r, "name": f"{side}: {r.get('name')}"} for r in results]


def write_compare_report(baselines: list[dict[str, Any]], news: list[dict[str, Any]],
                         gate: Any, path: Path) -> int:
    title = (f"infbench compare: {gate.metric} — "
             f"{'PASS' if gate.passed else 'FAIL'}")
    return _write(path, title, compare_sections(baselines, news, gate))


# ------------------------------------------------------------------ the document
STYLE = """
:root { color-scheme: light; --fg: #1a1a1a; --muted: #5a5a5a; --line: #d9d9d9;
        --bg-alt: #f6f7f9; --accent: #0072B2; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
       sans-serif; color: var(--fg); margin: 0; line-height: 1.45; font-size: 15px; }
header { padding: 18px 28px 8px; border-bottom: 1px solid var(--line); }
header h1 { font-size: 22px; margin: 0 0 4px; }
header p { margin: 0; color: var(--muted); font-size: 13px; }
nav { padding: 8px 28px; border-bottom: 1px solid var(--line); background: var(--bg-alt);
      position: sticky; top: 0; z-index: 5; font-size: 14px; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; white-space: nowrap; }
main { padding: 0 28px 40px; max-width: 1500px; }
section { padding-top: 10px; }
h2 { font-size: 19px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 8px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; margin: 10px 0;
        background: var(--bg-alt); }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dt { color: var(--muted); } dd { margin: 0; word-break: break-word; }
.table-wrap { overflow-x: auto; margin: 10px 0; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
caption { text-align: left; color: var(--muted); padding: 4px 0; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 9px; text-align: left;
         white-space: nowrap; }
th { background: var(--bg-alt); font-weight: 600; }
td.num, th.num { text-align: right; }
tbody tr:hover { background: #eef4fa; }
ul.notes { color: var(--muted); font-size: 13px; padding-left: 20px; }
details { font-size: 13px; color: var(--muted); } summary { cursor: pointer; }
ul.verdict, p.verdict { font-weight: 600; }
p.verdict.pass { color: #00733c; } p.verdict.fail { color: #b00020; }
figure { margin: 14px 0 22px; }
figure .plot { width: 100%; min-height: 300px; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
noscript p { color: #b00020; font-size: 13px; }
footer { color: var(--muted); font-size: 12px; padding: 12px 28px; border-top: 1px solid
         var(--line); }
"""

CONFIG = {"displaylogo": False, "responsive": True,
          "toImageButtonOptions": {"format": "svg"}}


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element (no `</`, no `<!--`)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"), default=_finite)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _finite(value: Any) -> Any:
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN and inf (a metric a run lacks, a rate of inf) become null for strict JSON."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _figure_html(fig: Figure) -> str:
    return (f'<figure><div class="plot" id="{escape(fig.id)}" data-figure="plotly"></div>'
            f'<figcaption>{escape(fig.caption)}</figcaption></figure>')


def render(title: str, sections: Sequence[Section],
           plotly_js: Callable[[], str] | None = None) -> str:
    """The whole page as text (the figures' data in one JSON block, drawn on load)."""
    from plotly.offline import get_plotlyjs

    from infbench.core.version import __version__

    js = (plotly_js or get_plotlyjs)()
    nav = "\n".join(f'<a href="#{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    body = []
    all_figures: dict[str, Any] = {}
    for s in sections:
        parts = [f'<section id="{escape(s.id)}" data-section="{escape(s.id)}">'
                 f"<h2>{escape(s.title)}</h2>", s.html]
        for fig in s.figures:
            parts.append(_figure_html(fig))
            all_figures[fig.id] = _clean(fig.data)
        parts.append("</section>")
        body.append("".join(parts))
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    draw = ("(function(){var figs=JSON.parse(document.getElementById('infbench-figures')"
            ".textContent);var cfg=" + _script_json(CONFIG) + ";"
            "Object.keys(figs).forEach(function(id){var f=figs[id];"
            "Plotly.newPlot(id,f.data,f.layout,cfg);});})();")
    noscript = ("<noscript><p>JavaScript is off: the tables read as they are; the figures need "
                "JavaScript (plotly.js, inline in this file).</p></noscript>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{escape(title)}</h1><p>written {made} by infbench {escape(__version__)}"
        "; one self-contained file: hover a figure for values, drag to zoom, double-click to "
        f"reset, click a legend entry to hide it</p></header>{noscript}<nav>{nav}</nav>"
        f"<main>{''.join(body)}</main>"
        "<footer>Metric definitions: docs/results.md; TTFT arrival → first token, TPOT (E2E − "
        "TTFT) / (output tokens − 1), ITL the gaps between one request's tokens.</footer>"
        f"<script>{js}</script>"
        '<script type="application/json" id="infbench-figures">'
        f"{_script_json(all_figures)}</script><script>{draw}</script></body></html>\n")


def _write(path: Path, title: str, sections: Sequence[Section]) -> int:
    text = render(title, sections)
    write_text_atomic(path, text)
    return len(text.encode())
