"""Tables from result files: the post-run summary and measured-vs-predicted error.

`run_table()` is what `infbench run` prints after a run; `report_frame()` puts each
point's measured TTFT, decode time per token and output throughput next to the
analytic prediction with the error of the model,

    error % = (predicted - measured) / measured * 100

so a negative TPOT error means the roofline promised a faster decode than the
engine delivered.  A point run with `measure.window` shows its window's figures
(`accessor.measured`: `metrics.window`), with the whole run's tokens/s beside them in the
rows; `confidence_table` gives each point's t interval over its repeats
(results/confidence.py, docs/windows.md).  No torch here; pandas is imported inside the
functions that use it so that `infbench run`'s summary table does not pay for it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infbench.core.errors import UserError
from infbench.core.io import write_text_atomic
from infbench.core.metric_names import TTFO_METRIC
from infbench.results.accessor import has_window, measured, metric, scenario_number
from infbench.results.confidence import format_interval, result_interval
from infbench.results.moe import has_moe, moe_columns
from infbench.results.prefix import has_prefix, prefix_columns
from infbench.results.server_metrics import has_server_metrics, server_columns
from infbench.results.speculative import EXPORTED as SPEC_EXPORTED
from infbench.results.speculative import has_speculative, spec_row

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _compact(value: float | None) -> str:
    """About three significant digits: 2346, 46.2, 0.35 (narrow columns for 80-wide CI logs)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def short_label(label: Any) -> str:
    """`workload.batch_size=4,engine.x=1` -> `batch_size=4,x=1` (the swept keys' last part)."""
    parts = []
    for part in str(label).split(","):
        key, eq, value = part.partition("=")
        parts.append(f"{key.rsplit('.', 1)[-1]}{eq}{value}" if eq else part)
    return ",".join(parts)


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured * 100; None when either side is unknown."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured * 100


RUN_SUMMARY_METRICS = ("output_tokens_per_s", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
                       "itl_s.p99", "e2e_s.p50", "decode.mbu", "peak_kv_bytes",
                       "prediction.output_tokens_per_s")


# Shown (run's table, report) only where a result has an `accuracy` section.
ACCURACY_METRICS = ("accuracy.perplexity", "accuracy.perplexity_change",
                    "accuracy.greedy_agreement")


def has_accuracy(results: list[dict[str, Any]]) -> bool:
    return any(r.get("accuracy") for r in results)


# Shown (run's summary, report) only where a result was run with measure.slo.
GOODPUT_METRICS = ("goodput_requests_per_s", "slo_attainment")


def has_goodput(results: list[dict[str, Any]]) -> bool:
    return any(metric(r, "slo_attainment") is not None for r in results)


def run_summary(result: dict[str, Any]) -> dict[str, Any]:
    """One point's headline numbers, SI units, keyed by metric name (`run --json`)."""
    return {
        "point_index": result.get("point_index"),
        "name": result.get("name"),
        "label": result.get("label"),
        "file": result.get("_path"),
        "num_requests": measured(result, "num_requests"),
        **{name: measured(result, name) for name in RUN_SUMMARY_METRICS},
        **({"window": True} if has_window(result) else {}),
        **({name: metric(result, name) for name in ACCURACY_METRICS}
           if result.get("accuracy") else {}),
        **({name: metric(result, name) for name in GOODPUT_METRICS}
           if has_goodput([result]) else {}),
    }


def run_table(results: list[dict[str, Any]], title: str | None = None) -> Table:
    """One row per point: throughput, latency percentiles, decode MBU, KV peak, prediction.

    Point labels fold onto more lines instead of being cut: `batch_si…` named no point.
    """
    from rich.table import Table

    table = Table(title=title or "infbench run")
    labels = [str(r.get("label") or r.get("name")) for r in results]
    # TTFO (a reasoning model's first content token) only when some point measured it
    ttfo = f"{TTFO_METRIC}.p50"
    has_ttfo = any(measured(r, ttfo) is not None for r in results)
    rows = []
    for r, label in zip(results, labels, strict=True):
        requests = measured(r, "num_requests")
        rows.append([
            label,
            "-" if requests is None else str(int(requests)),
            _fmt(measured(r, "output_tokens_per_s")),
            _fmt(_scaled(measured(r, "ttft_s.p50"), 1e3)),
            _fmt(_scaled(measured(r, "ttft_s.p99"), 1e3)),
            *([_fmt(_scaled(measured(r, ttfo), 1e3))] if has_ttfo else []),
            _fmt(_scaled(measured(r, "tpot_s.p50"), 1e3)),
            _fmt(_scaled(measured(r, "itl_s.p99"), 1e3)),
            _fmt(_scaled(metric(r, "decode.mbu"), 100)) + _over(metric(r, "decode.mbu")),
            _fmt(_scaled(metric(r, "peak_kv_bytes"), 1e-6), 2),
            _fmt(metric(r, "prediction.output_tokens_per_s")),
        ])
    # A long label folds onto more lines instead of being cut (rich's default ellipsis),
    # and keeps room for its first 16 characters when the terminal is narrow.
    table.add_column("point", overflow="fold", min_width=min(16, max(map(len, labels),
                                                                    default=5)))
    cols = ("requests", "output tok/s", "TTFT p50 ms", "TTFT p99 ms",
            *(("TTFO p50 ms",) if has_ttfo else ()), "TPOT p50 ms",
            "ITL p99 ms", "decode MBU %", "peak KV MB", "predicted tok/s")
    for i, col in enumerate(cols, start=1):  # a number is never cut (1,78… is no number)
        table.add_column(col, justify="right", overflow="fold",  # headers fold too
                         min_width=max((len(row[i]) for row in rows), default=1))
    for row in rows:
        table.add_row(*row)
    if any(has_window(r) for r in results):
        table.caption = WINDOW_CAPTION
    mbu_col = cols.index("decode MBU %") + 1
    if any(row[mbu_col].endswith(OVER_MARK) for row in rows):
        table.caption = OVER_CAPTION
    return table


OVER_MARK = " *"
WINDOW_CAPTION = ("points run with measure.window show their window's requests, tok/s and "
                  "latencies (metrics.window); the whole run's are in metrics")
OVER_CAPTION = ("* decode MBU above 100%: the reason is in the note printed for the point and "
                "in the result's metrics.noise.warnings")


def _over(mbu: float | None) -> str:
    """The mark beside an MBU above 100%, whose reason `measure.metrics.mbu_reasons` gave."""
    return OVER_MARK if mbu is not None and mbu > 1.0 else ""


def accuracy_table(results: list[dict[str, Any]]) -> Table | None:
    """The points' accuracy (`run` prints it under its table), or None when no point has it."""
    from rich.table import Table

    if not has_accuracy(results):
        return None
    table = Table(title="accuracy: held-out text, reference = the unquantized model, same dtype")
    table.add_column("point", overflow="fold")
    for col in ("perplexity", "reference", "change %", "greedy agreement", "tokens"):
        table.add_column(col, justify="right")
    for r in results:
        ppl, change, agree = (metric(r, name) for name in ACCURACY_METRICS)
        tokens = metric(r, "accuracy.tokens")
        table.add_row(str(r.get("label") or r.get("name")), _fmt(ppl, 3),
                      _fmt(metric(r, "accuracy.reference_perplexity"), 3),
                      "-" if change is None else f"{change * 100:+.2f}", _fmt(agree, 3),
                      "-" if tokens is None else f"{int(tokens):,}")
    return table


def _first(result: dict[str, Any], *names: str) -> float | None:
    for name in names:
        value = metric(result, name)
        if value is not None:
            return value
    return None


def report_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of `report_frame` as plain dicts (None where a value is unknown); the
    accuracy columns only where some result has an `accuracy` section, the `spec_*` columns
    (results/speculative.py) only where some result has `metrics.speculative`, the goodput
    columns only where some result was run with `measure.slo`, the `prefix_*` columns only
    where some result has prefix groups, the `server_*` columns (results/server_metrics.py)
    only where some client run scraped the server's metrics."""
    with_accuracy = has_accuracy(results)
    with_goodput = has_goodput(results)
    with_spec = has_speculative(results)
    with_moe = has_moe(results)
    with_prefix = has_prefix(results)
    with_server = has_server_metrics(results)
    with_flags = any(_profile_flags(r) for r in results)
    with_window = any(has_window(r) for r in results)
    rows = []
    for r in results:
        scenario = r.get("scenario") or {}
        ttft_m = _scaled(measured(r, "ttft_s.p50"), 1e3)
        ttft_p = _scaled(metric(r, "prediction.ttft_s"), 1e3)
        # TPOT is the metric definition: (E2E - TTFT) / (output tokens - 1) per request,
        # p50 measured, and the prediction of the same quantity.  The decode step time is a
        # different number (the mean decode-only step, and the decode stage's step time
        # predicted) and keeps its own name.
        tpot_m = _scaled(measured(r, "tpot_s.p50"), 1e3)  # None when p50 was not measured
        tpot_p = _scaled(metric(r, "prediction.tpot_s"), 1e3)
        step_m = _scaled(_first(r, "decode.time_per_token_s", "tpot_s.p50"), 1e3)
        step_p = _scaled(_first(r, "prediction.decode.time_per_token_s",
                                   "prediction.tpot_s"), 1e3)
        tps_m = measured(r, "output_tokens_per_s")
        tps_p = metric(r, "prediction.output_tokens_per_s")
        rows.append({
            "label": r.get("label"),
            "name": r.get("name"),
            "point_index": r.get("point_index"),
            "hardware": (r.get("hardware") or {}).get("name", scenario.get("hardware")),
            "batch_size": scenario_number(r, "workload.batch_size"),
            "ttft_ms_measured": ttft_m,
            "ttft_ms_predicted": ttft_p,
            "ttft_error_pct": error_pct(ttft_p, ttft_m),
            "tpot_ms_measured": tpot_m,
            "tpot_ms_predicted": tpot_p,
            "tpot_error_pct": error_pct(tpot_p, tpot_m),
            "decode_step_ms_measured": step_m,
            "decode_step_ms_predicted": step_p,
            "decode_step_error_pct": error_pct(step_p, step_m),
            "output_tok_s_measured": tps_m,
            "output_tok_s_predicted": tps_p,
            "output_tok_s_error_pct": error_pct(tps_p, tps_m),
            **({"window_s": metric(r, "window.wall_s"),
                "output_tok_s_whole_run": metric(r, "output_tokens_per_s")}
               if with_window else {}),
            "decode_mbu_pct": _scaled(metric(r, "decode.mbu"), 100),
            "decode_mfu_pct": _scaled(metric(r, "decode.mfu"), 100),
            "prefill_mfu_pct": _scaled(metric(r, "prefill.mfu"), 100),
            **({"perplexity": metric(r, "accuracy.perplexity"),
                "perplexity_change_pct": _scaled(metric(r, "accuracy.perplexity_change"), 100),
                "greedy_agreement": metric(r, "accuracy.greedy_agreement")}
               if with_accuracy else {}),
            **({name: metric(r, name) for name in GOODPUT_METRICS} if with_goodput else {}),
            **(_spec_columns(r) if with_spec else {}),
            **(moe_columns(r) if with_moe else {}),  # MoE routing vs the roofline (moe.py)
            **(prefix_columns(r) if with_prefix else {}),  # hit rates (prefix.py)
            **(server_columns(r) if with_server else {}),  # a target's /metrics summary
            **({"profile_flags": "; ".join(_profile_flags(r)) or None} if with_flags else {}),
            "file": r.get("_path"),
        })
    return rows


def _profile_flags(result: dict[str, Any]) -> list[str]:
    return list((result.get("prediction") or {}).get("profile_flags") or [])


def profile_flag_notes(results: list[dict[str, Any]]) -> list[str]:
    """One stderr line per flag of each flagged profile the predictions were priced on."""
    counts: dict[tuple[str, str], int] = {}
    for r in results:
        hw = str((r.get("prediction") or {}).get("hardware") or "?")
        for flag in _profile_flags(r):
            counts[hw, flag] = counts.get((hw, flag), 0) + 1
    return [f"note: {n} prediction{'s' * (n != 1)} priced on the flagged profile {hw!r}: {flag}"
            for (hw, flag), n in counts.items()]


def _spec_columns(result: dict[str, Any]) -> dict[str, Any]:
    """The `spec_*` columns of one point (all None for a point without speculative metrics)."""
    row = spec_row(result) or {}
    return {f"spec_{key}": row.get(key) for key in SPEC_EXPORTED}


def report_frame(results: list[dict[str, Any]]) -> pd.DataFrame:
    """Measured, predicted and error % for TTFT, TPOT and output tok/s; decode MBU/MFU."""
    import pandas as pd

    df = pd.DataFrame(report_rows(results))
    numeric = [c for c in df.columns
               if c not in ("label", "name", "hardware", "file", "spec_method", "profile_flags",
                            "server_metrics_source")]
    df[numeric] = df[numeric].apply(pd.to_numeric)  # None -> NaN
    return df


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.4g}"
    return str(value).replace("|", "\\|")


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub pipe table; numeric columns right-aligned, missing values blank."""
    import pandas as pd

    headers = [str(c) for c in df.columns]
    aligns = ["---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(aligns) + " |"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _triple(measured: float | None, predicted: float | None, error: float | None) -> str:
    text = f"{_compact(measured)} / {_compact(predicted)}"
    if error is not None and not math.isnan(error):
        text += f" {error:+.0f}%"
    return text


def report_table(df: pd.DataFrame) -> Table:
    """The measured-vs-predicted frame for the terminal: `measured / predicted error%` cells."""
    from rich.table import Table

    table = Table(title="measured / predicted, error % = (predicted - measured) / measured")
    table.add_column("point", overflow="fold")
    # TPOT is per request (the metric definition, as in `run`'s table); the decode step is
    # the mean decode-only step time, which the roofline prices directly.
    with_accuracy = "perplexity" in df.columns
    for title in ("TTFT p50 ms", "TPOT p50 ms", "decode step ms", "output tok/s", "MBU %",
                  "MFU %", *(("perplexity", "greedy agree") if with_accuracy else ())):
        table.add_column(title, justify="right")
    records = df.to_dict("records")
    labels = [short_label(rec["label"]) for rec in records]
    if len(set(labels)) < len(labels):  # the same point from several files: say which
        labels = [f"{lab} ({Path(str(rec.get('file'))).stem})"
                  for lab, rec in zip(labels, records, strict=True)]
    for label, rec in zip(labels, records, strict=True):
        table.add_row(
            label,
            *(_triple(rec[f"{k}_measured"], rec[f"{k}_predicted"], rec[f"{e}_error_pct"])
              for k, e in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"),
                           ("decode_step_ms", "decode_step"), ("output_tok_s", "output_tok_s"))),
            _compact(rec["decode_mbu_pct"]) + _over(_scaled(rec["decode_mbu_pct"], 0.01)),
            _compact(rec["decode_mfu_pct"]),
            *(_accuracy_pair(rec) if with_accuracy else ()))
        if _over(_scaled(rec["decode_mbu_pct"], 0.01)):
            table.caption = OVER_CAPTION
    return table


def _accuracy_pair(rec: dict[str, Any]) -> tuple[str, str]:
    ppl, change = rec["perplexity"], rec["perplexity_change_pct"]
    text = _compact(ppl)
    if change is not None and not math.isnan(change):
        text += f" {change:+.2f}%"
    return text, _compact(rec["greedy_agreement"])


# The figures `report` gives an interval for (each read in the window when there is one).
CONFIDENCE_METRICS = (("output tok/s", "output_tokens_per_s", 1.0),
                      ("TTFT p50 ms", "ttft_s.p50", 1e3), ("TPOT p50 ms", "tpot_s.p50", 1e3),
                      ("E2E p50 ms", "e2e_s.p50", 1e3))


def _read_name(result: dict[str, Any], name: str) -> str:
    from infbench.results.accessor import windowed_name

    return (windowed_name(name) or name) if has_window(result) else name


def confidence_rows(results: list[dict[str, Any]], level: float) -> list[dict[str, Any]]:
    """Per result: {level, repeats, metrics: {name: interval}} for every metric of its
    spread (None where it has fewer than two repeats with the value)."""
    out = []
    for r in results:
        names = list(r.get("spread") or {})
        intervals = {}
        for name in names:
            try:
                ci = result_interval(r, name, level)
            except UserError:  # a spread key the accessor does not know: no interval
                continue
            intervals[name] = None if ci is None else ci.to_dict()
        out.append({"level": level, "repeats": len(r.get("repeats") or []),
                    "metrics": intervals})
    return out


def confidence_table(results: list[dict[str, Any]], level: float) -> Table | None:
    """mean ± half-width of the t interval over each point's repeats (None when no point
    has two repeats)."""
    from rich.table import Table

    if not any(len(r.get("repeats") or []) >= 2 for r in results):
        return None
    windowed = any(has_window(r) for r in results)
    table = Table(title=f"mean ± {level * 100:g}% t interval over the repeats"
                  + (" (windowed points: their window)" if windowed else ""))
    table.add_column("point", overflow="fold")
    table.add_column("repeats", justify="right")
    for title, _, _ in CONFIDENCE_METRICS:  # a number ± its half-width is never cut
        table.add_column(title, justify="right", no_wrap=True)
    for r in results:
        cells = [format_interval(result_interval(r, _read_name(r, name), level), scale)
                 .replace(" ± ", "±") for _, name, scale in CONFIDENCE_METRICS]
        table.add_row(short_label(r.get("label") or r.get("name")),
                      str(len(r.get("repeats") or [])), *cells)
    return table


def write_csv(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    write_text_atomic(path, df.to_csv(index=False))


def write_markdown(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    write_text_atomic(path, to_markdown(df))
