"""The report's tables as plain HTML (readable with JavaScript off): the run card, measured
against predicted per point, percentiles, and the rows `infbench report` prints for
variants, speculative decoding, MoE routing and goodput (read from the same `results`
functions, so the page and the terminal agree).  Every value is escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from infbench.plots.measured import PERCENTILES, model_name, percentile_data, point_labels
from infbench.results.report import report_rows, short_label

Cell = str | float | int | None


def fmt(value: Any, digits: int = 3) -> str:
    """About `digits` significant digits, thousands separated; '-' for None or NaN."""
    if value is None or isinstance(value, bool):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value == math.inf else "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 10 ** digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def pct(value: float | None, signed: bool = True) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], *, caption: str = "",
          cls: str = "", numeric_from: int = 1) -> str:
    """An escaped HTML table; columns from `numeric_from` on are right-aligned."""
    head = "".join(f'<th{" class=num" if i >= numeric_from else ""}>{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(f'<td{" class=num" if i >= numeric_from else ""}>'
                        f'{escape(c if isinstance(c, str) else fmt(c))}</td>'
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table class="{cls}">{cap}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def definition_list(items: Sequence[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items
                            if v) + "</dl>"


def notes(lines: Sequence[str], cls: str = "notes", fold_over: int = 4,
          what: str = "notes") -> str:
    """A list of notes; more than `fold_over` fold into a <details> (opens without JS)."""
    if not lines:
        return ""
    items = f'<ul class="{cls}">' + "".join(f"<li>{escape(line)}</li>" for line in lines)
    items += "</ul>"
    if len(lines) <= fold_over:
        return items
    return f"<details><summary>{len(lines)} {escape(what)}</summary>{items}</details>"


# ------------------------------------------------------------------ the run card
def _model_text(result: dict[str, Any]) -> str:
    cfg = result.get("model_config") or {}
    scenario = result.get("scenario") or {}
    source = scenario.get("model") if isinstance(scenario.get("model"), dict) else {}
    parts = [model_name(result)]
    if cfg:
        shape = [f"{cfg.get('num_layers')} layers", f"hidden {cfg.get('hidden_size')}",
                 f"{cfg.get('num_heads')} heads / {cfg.get('num_kv_heads')} KV heads",
                 f"vocab {cfg.get('vocab_size')}"]
        moe = cfg.get("moe")
        if isinstance(moe, dict) and moe.get("num_experts"):
            shape.append(f"MoE {moe.get('num_experts')} experts, "
                         f"top-{moe.get('num_experts_per_tok')}")
        parts.append(", ".join(shape))
    target = scenario.get("target")
    if isinstance(target, dict):
        parts.append(f"served at {target.get('base_url')} as {target.get('model')}")
    elif source:
        where = {k: v for k, v in source.items() if k in ("preset", "path", "gguf")}
        parts.append(", ".join(f"{k} {v}" for k, v in where.items()))
    weights = (result.get("env") or {}).get("model_weights")
    if weights:
        parts.append(f"weights: {weights}")
    return " · ".join(p for p in parts if p)


def _hardware_text(result: dict[str, Any]) -> str:
    hw = result.get("hardware") or {}
    if not hw:
        name = (result.get("scenario") or {}).get("hardware")
        return f"{name} (no hardware section)" if name else "-"
    peaks = ", ".join(f"{d} {fmt(v / 1e12)} TFLOP/s" for d, v in (hw.get("peak_flops") or {})
                      .items())
    bw = hw.get("bandwidth")
    return " · ".join(p for p in (
        str(hw.get("name")), str(hw.get("description") or ""),
        f"{fmt(bw / 1e9)} GB/s" if bw else "", peaks, f"source: {hw.get('source')}"
        if hw.get("source") else "") if p)


def _dates(results: Sequence[dict[str, Any]]) -> str:
    stamps = sorted({str(s) for r in results if (s := (r.get("env") or {}).get("timestamp"))})
    if not stamps:
        return "-"
    return stamps[0] if len(stamps) == 1 else f"{stamps[0]} … {stamps[-1]}"


def _distinct(values: Sequence[str]) -> str:
    seen = list(dict.fromkeys(v for v in values if v))
    return "; ".join(seen) if seen else "-"


def _workload_text(group: Sequence[dict[str, Any]]) -> str:
    """`kind static, batch_size 1 / 4 / 8, ...`: each key's values over the points."""
    parts = []
    for key in ("kind", "batch_size", "rate", "num_requests", "prompt_len", "gen_len"):
        values = list(dict.fromkeys(str(w[key]) for r in group
                                    if isinstance(w := (r.get("scenario") or {})
                                                  .get("workload"), dict)
                                    and w.get(key) is not None))
        if values:
            parts.append(f"{key} {' / '.join(values)}")
    return ", ".join(parts)


def run_cards(results: Sequence[dict[str, Any]]) -> str:
    """One card per scenario among the results: what ran, on what, with what, when."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_name.setdefault(str(r.get("name")), []).append(r)
    cards = []
    for name, group in by_name.items():
        first = group[0]
        scenario = first.get("scenario") or {}
        env = first.get("env") or {}
        packages = env.get("packages") or {}
        versions = ", ".join([f"infbench {env.get('infbench_version')}",
                              f"python {env.get('python')}",
                              *(f"{k} {v}" for k, v in packages.items() if v)])
        swept = sorted({k for r in group for k in ((r.get("scenario") or {}).get("swept") or {})})
        items = [
            ("scenario", f"{name} ({scenario.get('source') or 'no source recorded'})"),
            ("description", str(scenario.get("description") or "")),
            ("points", f"{len(group)}" + (f", sweeping {', '.join(swept)}" if swept else "")),
            ("workload", _workload_text(group)),
            ("model", _distinct([_model_text(r) for r in group])),
            ("dtype / device / backend", f"{scenario.get('dtype', '-')} / "
                                         f"{env.get('device', '-')} / {env.get('backend', '-')}"),
            ("hardware (roofline)", _distinct([_hardware_text(r) for r in group])),
            ("machine", " · ".join(str(v) for v in (env.get("device_name"), env.get("host"),
                                                   env.get("platform"),
                                                   f"{env.get('cpu_count')} CPUs"
                                                   if env.get("cpu_count") else None) if v)),
            ("CPU flags", ", ".join(env.get("cpu_flags") or []) or "-"),
            ("versions", versions),
            ("git sha", _distinct([str((r.get("env") or {}).get("git_sha") or "")
                                   for r in group])),
            ("date (UTC)", _dates(group)),
            ("measure", ", ".join(f"{k} {v}" for k, v in (scenario.get("measure") or {}).items()
                                  if k in ("warmup", "repeats", "eval_tokens")
                                  and v is not None)),
        ]
        cards.append(f'<div class="card"><h3>{escape(name)}</h3>{definition_list(items)}</div>')
    return "".join(cards)


# ------------------------------------------------------------------ measured vs predicted
def _spread_text(result: dict[str, Any], key: str, scale: float = 1.0) -> str:
    spread = (result.get("spread") or {}).get(key)
    if not isinstance(spread, dict) or spread.get("min") is None or spread.get("max") is None:
        return "-"
    return f"{fmt(spread['min'] * scale)}–{fmt(spread['max'] * scale)}"


def points_table(results: Sequence[dict[str, Any]]) -> str:
    """Measured / predicted / error % per point, the repeats' range, MBU and MFU."""
    rows = report_rows(list(results))
    labels = point_labels(list(results))
    out = []
    for label, row, r in zip(labels, rows, results, strict=True):
        repeats = len(r.get("repeats") or [])
        out.append([
            short_label(label), row["batch_size"],
            row["ttft_ms_measured"], row["ttft_ms_predicted"], pct(row["ttft_error_pct"]),
            row["tpot_ms_measured"], row["tpot_ms_predicted"], pct(row["tpot_error_pct"]),
            row["decode_step_ms_measured"], row["decode_step_ms_predicted"],
            pct(row["decode_step_error_pct"]),
            row["output_tok_s_measured"], row["output_tok_s_predicted"],
            pct(row["output_tok_s_error_pct"]),
            f"{_spread_text(r, 'output_tokens_per_s')} ({repeats})" if repeats > 1 else "-",
            pct(row["decode_mbu_pct"], signed=False), pct(row["decode_mfu_pct"], signed=False)])
    headers = ("point", "batch", "TTFT p50 ms", "predicted", "error", "TPOT p50 ms",
               "predicted", "error", "decode step ms", "predicted", "error", "output tok/s",
               "predicted", "error", "tok/s range (repeats)", "decode MBU", "decode MFU")
    return table(headers, out, caption="measured, predicted and error % = (predicted − "
                 "measured) / measured", cls="points")


def noise_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """The runs' noise warnings (coefficient of variation over repeats), each once with the
    points it was raised on; then the calibrated profiles' flags and client failures."""
    from infbench.client.failures import failure_notes
    from infbench.results.report import profile_flag_notes

    seen: dict[str, list[str]] = {}
    for r, label in zip(results, point_labels(list(results)), strict=True):
        noise = (r.get("metrics") or {}).get("noise") or {}
        for warning in noise.get("warnings") or []:
            seen.setdefault(str(warning), []).append(short_label(label))
    lines = [f"{w} [{', '.join(pts) if len(pts) <= 4 else f'{len(pts)} points'}]"
             for w, pts in seen.items()]
    return (lines + profile_flag_notes(list(results)) + failure_notes(list(results)))


def percentiles_table(results: Sequence[dict[str, Any]]) -> str:
    data = percentile_data(list(results))
    metrics = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    headers = ["point"] + [f"{m.split('_')[0].upper()} {q}" for m in metrics for q in PERCENTILES]
    rows = [[short_label(label)] + [data[label][m][q] for m in metrics for q in PERCENTILES]
            for label in data]
    return table(headers, rows, caption="latency percentiles, ms (median over the repeats)")


# ------------------------------------------------------------------ the optional sections
def variants_table(rows: Sequence[dict[str, Any]]) -> str:
    batches = sorted({b for row in rows for b in row["decode_tokens_per_s"]})
    headers = ["variant", "dtype", "weights MB", "KV B/token",
               *(f"decode tok/s b={b}" for b in batches), "perplexity", "change",
               "greedy agreement"]
    out = []
    for row in rows:
        change = row["perplexity_change"]
        out.append([row["variant"], str(row["dtype"] or "-"),
                    None if row["weight_bytes"] is None else row["weight_bytes"] / 1e6,
                    row["kv_bytes_per_token"],
                    *(row["decode_tokens_per_s"].get(b) for b in batches), row["perplexity"],
                    "-" if change is None else pct(100 * change), row["greedy_agreement"]])
    return table(headers, out, caption="variants: bytes, speed and accuracy", numeric_from=2)


def spec_table(rows: Sequence[dict[str, Any]]) -> str:
    from infbench.results.speculative import SPEC_COLUMNS, spec_cells

    return table(SPEC_COLUMNS, [spec_cells(row) for row in rows],
                 caption="speculative decoding: speed-up over plain decoding of the same "
                         "workload")


def moe_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = ("point", "experts/step", "uniform", "expert MB", "roofline MB", "diff",
               "max/mean", "CV", "decode experts/step", "decode uniform", "decode diff")
    out = [[r["label"], r["experts_touched_per_step"], r["expected_experts_per_step"],
            None if r["expert_bytes"] is None else r["expert_bytes"] / 1e6,
            None if r["expected_expert_bytes"] is None else r["expected_expert_bytes"] / 1e6,
            pct(r["expert_bytes_error_pct"]), r["max_over_mean"], r["cv"],
            r["decode_experts_touched_per_step"], r["decode_expected_experts_per_step"],
            pct(r["decode_expert_bytes_error_pct"])] for r in rows]
    return table(headers, out, caption="MoE routing: measured against uniform routing (the "
                 "roofline's)")


def goodput_table(rows: Sequence[dict[str, Any]]) -> str:
    from infbench.results.goodput import rate_text

    out = [[short_label(r["label"]), rate_text(r["rate"]), r["goodput_requests_per_s"],
            pct(None if r["slo_attainment"] is None else 100 * r["slo_attainment"], False),
            r["ttft_p99_ms"], r["tpot_p99_ms"], r["e2e_p50_ms"]] for r in rows]
    return table(("point", "rate req/s", "goodput req/s", "within SLO", "TTFT p99 ms",
                  "TPOT p99 ms", "E2E p50 ms"), out,
                 caption="goodput: requests meeting every objective")


def _seconds(metric: str) -> bool:
    """A latency (ttft_s.p50, e2e_s): shown in ms; rates (_per_s) are not times."""
    head = metric.split(".")[0]
    return head.endswith("_s") and not head.endswith("_per_s")


def _range(span: tuple[float | None, float | None], scale: float) -> str:
    lo, hi = span
    return "-" if lo is None or hi is None else f"{fmt(lo * scale)}–{fmt(hi * scale)}"


def change_table(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison's rows: each metric's baseline and new value, their repeats' ranges,
    the change and the status (the gated metric first); latencies in ms."""
    out = []
    for r in rows:
        scale = 1e3 if _seconds(r["metric"]) else 1.0
        name = r["metric"] + (" ms" if scale != 1.0 else "") + (" (gated)" if r["gated"] else "")
        out.append([short_label(r["point"]), name, r["baseline"] * scale,
                    _range(r["baseline_range"], scale), r["new"] * scale,
                    _range(r["new_range"], scale), pct(r["change_pct"]), r["source"],
                    r["status"]])
    return table(("point", "metric", "baseline", "baseline range", "new", "new range",
                  "change", "from", "status"), out, caption="each metric: new against "
                 "baseline (lower is better for latencies, bytes and perplexity)",
                 numeric_from=2, cls="changes")
