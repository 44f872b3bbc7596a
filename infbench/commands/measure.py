"""`infbench calibrate`, `infbench report`, `infbench compare` and `infbench plots`.

Only `calibrate` needs torch, and imports it inside the command: `report` and
`compare` read JSON and start without it (a CI gate should not pay for torch).
Exit codes of `compare`: 0 pass, 1 regression beyond the threshold, 2 unusable input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError
from infbench.core.io import check_output_file


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("plots")(plots)


def calibrate_model_steps(model: str, dtype: str, device: str, name: str, quick: bool,
                          as_json: bool) -> None:
    """`calibrate --model`: the model's steps against their price, saved into profile `name`."""
    from rich.console import Console
    from rich.table import Table

    from infbench.checkpoint.metadata import model_source
    from infbench.measure.calibrate_model import (
        check_calibrated,
        measure_model_steps,
        save_model_steps,
    )

    check_calibrated(name)
    doc = {"device": "cpu" if device == "auto" else device, "dtype": dtype,
           "model": model_source(model)}
    console = Console(stderr=True)
    with console.status(f"calibrating {model}'s steps") as status:
        key, entry = measure_model_steps(doc, name, quick=quick,
                                         log=lambda text: status.update(f"{model}: {text}"))
    path = save_model_steps(name, key, entry)
    if as_json:
        print(json.dumps({"name": name, "model": model, "key": key, **entry,
                          "profile_path": str(path)}, indent=2))
        return
    table = Table(title=f"{model} steps on profile {name!r}: engine measured vs priced")
    for column in ("step", "tokens", "measured ms", "priced ms", "measured / priced"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for kind in ("decode", "prefill"):
        for size, measured, priced in entry[kind]:
            table.add_row(kind, f"{size:g}", f"{measured * 1e3:.2f}", f"{priced * 1e3:.2f}",
                          f"{measured / priced:.3f}")
    Console().print(table)
    print(f"saved the ratios into {path} (measure/calibrate_model.py); predictions under load "
          f"of {model} on hardware: {name} scale each step by them")


def calibrate(
    device: str = typer.Option("auto", "--device", callback=opt.non_empty,
                               help="auto | cpu | cuda"),
    quick: bool = typer.Option(False, "--quick", help="Small buffers and few repeats (seconds)."),
    name: str = typer.Option("local", "--name",
                             help="Profile name: `hardware: NAME` (lower-case letters, "
                                  "digits, . _ -; at most 64 characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    model: str | None = typer.Option(
        None, "--model", help="Calibrate this model's engine steps on the saved profile "
        "--name instead (a preset, HF directory or .gguf): the simulation's step ratios."),
    dtype: str = typer.Option("float32", "--dtype", help="With --model: the model dtype."),
) -> None:
    """Measure this machine's bandwidth and FLOP/s and save them as a hardware profile.

    With --model, measure that model's decode and prefill steps in the engine against the
    simulation's price of them on the saved profile, and add the ratios to it (predictions
    under load use them; docs/predictions-under-load.md).

    Each figure is the best of a round of repeats, re-measured (at most 3 rounds) when they
    spread by more than 20%; a figure still spread that far, or figures that disagree, are
    saved as flags (one `warning:` line each on stderr); figures that contradict each other
    beyond repair (a GEMV under a quarter of the streaming read) exit 2 with nothing saved."""
    from infbench.core.io import check_output_file
    from infbench.hardware.spec import check_profile_name, profile_path
    from infbench.measure.calibrate import calibrate as run_calibration
    from infbench.measure.calibrate import save_profile

    # The name and the profile store before the measurement (a minute), not after it.
    check_profile_name(name)
    if model is not None:
        calibrate_model_steps(model, dtype, device, name, quick, as_json)
        return
    try:
        check_output_file(profile_path(name), "--name")
    except UserError as exc:
        raise UserError(f"calibrate: {exc}; set INFBENCH_HOME to a writable directory for "
                        "the profile store") from None
    spec = run_calibration(device=device, quick=quick, name=name)
    path = save_profile(spec, name)
    extra = spec.extra
    for flag in spec.profile_flags:
        print(f"warning: calibrate: profile {name!r} flagged: {flag}", file=sys.stderr)
    if as_json:
        print(json.dumps({
            "name": name,
            "device": extra["device"],
            "quick": quick,
            "bandwidth_bytes_per_s": spec.bandwidth,
            "copy_bandwidth_bytes_per_s": extra["copy_bytes_per_s"],
            "gemv_bandwidth_bytes_per_s": extra["gemv_bytes_per_s"],
            "flops_per_s": spec.peak_flops,
            "memory_bytes": spec.memory_bytes,
            "torch_threads": extra["torch_threads"],
            "engine_backend": extra.get("engine_backend"),
            "decode_attention_bytes_per_s": extra.get("decode_attention_bytes_per_s"),
            "prefill_attention_flops_per_s": extra.get("prefill_attention_flops_per_s"),
            "spread": {k: f["spread"] for k, f in extra["figures"].items()
                       if k in ("read_bytes_per_s", "copy_bytes_per_s", "gemv_bytes_per_s",
                                "decode_attention_bytes_per_s",
                                "prefill_attention_flops_per_s")},
            "flags": spec.profile_flags,
            "profile_path": str(path),
        }, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{spec.description}{' (quick)' if quick else ''}")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    table.add_column("spread", justify="right")
    figures = extra["figures"]

    def spread(key: str) -> str:
        fig = figures.get(key)
        return "" if fig is None else f"{fig['spread']:.0%}" + (" !" if fig["flagged"] else "")

    table.add_row("read bandwidth", f"{extra['read_bytes_per_s'] / 1e9:.1f} GB/s",
                  spread("read_bytes_per_s"))
    if "engine_gemv_bytes_per_s" in extra:
        table.add_row("engine GEMV, batch 1", f"{extra['engine_gemv_bytes_per_s'] / 1e9:.1f} GB/s",
                      spread("matmul.float32.1"))
    table.add_row("profile bandwidth (the higher of the two)", f"{spec.bandwidth / 1e9:.1f} GB/s")
    table.add_row("copy bandwidth (read + write)", f"{extra['copy_bytes_per_s'] / 1e9:.1f} GB/s",
                  spread("copy_bytes_per_s"))
    rows, cols = extra["gemv_shape"]
    table.add_row(f"GEMV {rows}x{cols} {extra['gemv_dtype']}",
                  f"{extra['gemv_bytes_per_s'] / 1e9:.1f} GB/s", spread("gemv_bytes_per_s"))
    for dtype, flops in spec.peak_flops.items():
        by_size = extra["gemm_flops_per_s"][dtype]
        best = max(by_size, key=by_size.__getitem__)
        table.add_row(f"GEMM {dtype} (best size)", f"{flops / 1e9:,.1f} GFLOP/s",
                      spread(f"gemm.{dtype}.{best}"))
    curves = [(f"matmul {d}", f"matmul.{d}", c) for d, c in
              (extra.get("matmul_flops_by_tokens") or {}).items()]
    curves += [(f"{f} matmul", f"quant_matmul.{f}", c) for f, c in
               (extra.get("quant_matmul_flops_by_tokens") or {}).items()]
    for label, figure, curve in curves:
        for rows, flops in curve:
            if rows in (1, 32, 2048):
                table.add_row(f"engine {label}, {rows:g} row{'s' * (rows != 1)}",
                              f"{flops / 1e9:,.1f} GFLOP/s", spread(f"{figure}.{rows:g}"))
    if "decode_attention_bytes_per_s" in extra:
        table.add_row(f"decode attention KV read ({extra.get('engine_backend')} backend)",
                      f"{extra['decode_attention_bytes_per_s'] / 1e9:.1f} GB/s",
                      spread("decode_attention_bytes_per_s"))
    if "prefill_attention_flops_per_s" in extra:
        table.add_row("prefill attention",
                      f"{extra['prefill_attention_flops_per_s'] / 1e9:,.1f} GFLOP/s",
                      spread("prefill_attention_flops_per_s"))
    if "layer_overhead_s" in extra:
        table.add_row("decode fixed cost: step / layer / sequence-layer",
                      f"{extra['step_overhead_s'] * 1e6:.0f} / "
                      f"{extra['layer_overhead_s'] * 1e6:.1f} / "
                      f"{extra['seq_layer_overhead_s'] * 1e6:.2f} us")
    for dtype in spec.peak_flops:
        table.add_row(f"ridge point {dtype}", f"{spec.ridge_point(dtype):.1f} FLOP/byte")
    table.add_row("memory", f"{spec.memory_bytes / 1e9:.1f} GB")
    console = Console()
    console.print(table)
    flagged = len(spec.profile_flags)
    auto = "; `hardware: auto`, a CPU scenario's default, takes it on this machine" if (
        extra["device"] == "cpu" and not quick) else ""
    console.print(f"saved {path}; use `hardware: {name}` in a scenario{auto}"
                  + (f" ({flagged} flag{'s' * (flagged != 1)}: see the warnings)"
                     if flagged else ""))


def report(
    results: list[Path] = typer.Argument(..., help="Result JSON files or directories."),
    markdown: Path | None = typer.Option(None, "--markdown", callback=opt.output_file,
                                         help="Also write a Markdown table."),
    csv: Path | None = typer.Option(None, "--csv", callback=opt.output_file,
                                    help="Also write the table as CSV."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the rows as JSON on stdout instead of a table."),
    html: Path | None = typer.Option(None, "--html", callback=opt.output_file,
                                     help="Also write one self-contained HTML page (tables "
                                          "and interactive figures, no network) to FILE."),
    confidence: str = typer.Option("95%", "--confidence",
                                   help="Level of the t intervals over the repeats: 95% or "
                                        "0.95 (docs/windows.md)."),
) -> None:
    """Measured vs predicted TTFT, TPOT and throughput, with the prediction's error %.

    Below it, mean ± half-width of the t interval over each point's repeats (--json: the
    `confidence` of every metric in the result's spread).  Points run with measure.window
    show their window's figures (docs/windows.md).

    Results of a scenario with variants also get one row per variant (bytes, speed, accuracy),
    speculative points a table of acceptance and speed-up (also spec_* columns in the
    --json / --markdown / --csv rows), MoE points a table of routing statistics beside the
    roofline's expert bytes (docs/moe.md; moe_* columns in those rows), points with prefix
    groups their intended vs measured prefix-cache hit rate (docs/prefix.md; prefix_* columns),
    multi-turn sessions a table of latency by turn index (docs/sessions.md), and points run
    with measure.slo a goodput table and, over a rate sweep, the highest rate meeting the SLOs
    (slo_max_rate in --json rows); client runs with failed requests get a line each on
    stderr counting them by reason (docs/client.md), and client runs that scraped the
    server's /metrics a table of its KV usage, queues, preemptions and prefix-cache hit rate
    (docs/server-metrics.md; server_* columns in the --json / --markdown / --csv rows)."""
    from rich.console import Console

    from infbench.client.failures import failure_notes
    from infbench.results.confidence import parse_confidence
    from infbench.results.gate import load_results
    from infbench.results.goodput import (
        goodput_rows,
        goodput_table,
        group_label,
        json_rate,
        max_rate_line,
        max_rate_summaries,
    )
    from infbench.results.moe import moe_rows, moe_table
    from infbench.results.prefix import prefix_notes, prefix_rows, prefix_table
    from infbench.results.report import (
        confidence_rows,
        confidence_table,
        profile_flag_notes,
        report_frame,
        report_rows,
        report_table,
        write_csv,
        write_markdown,
    )
    from infbench.results.server_metrics import (
        missing_metrics_notes,
        server_metrics_rows,
        server_metrics_table,
    )
    from infbench.results.sessions import by_turn_rows, by_turn_table, session_lines
    from infbench.results.speculative import spec_rows, spec_table
    from infbench.results.under_load import predicted_results, under_load_rows, under_load_table
    from infbench.results.variants import variant_rows, variant_table

    level = parse_confidence(confidence)
    _check_outputs(("--markdown", markdown), ("--csv", csv), ("--html", html))
    loaded = load_results(results)
    df = report_frame(loaded)
    variants = variant_rows(loaded)
    speculative = spec_rows(loaded)
    goodput = goodput_rows(loaded)
    max_rates = max_rate_summaries(loaded)
    loads = under_load_rows(loaded)  # measured vs the simulated prediction
    predicted_max_rates = max_rate_summaries(predicted_results(loaded))
    for note in profile_flag_notes(loaded):  # predictions on a doubtful profile
        print(note, file=sys.stderr)
    for note in failure_notes(loaded):  # client runs: failed requests by reason
        print(note, file=sys.stderr)
    prefix = prefix_rows(loaded)
    for note in prefix_notes(prefix):  # measured hit rate far from the intended one
        print(note, file=sys.stderr)
    for note in missing_metrics_notes(loaded):  # client runs whose target had no /metrics
        print(note, file=sys.stderr)
    if as_json:
        rows = report_rows(loaded)
        if max_rates:  # each row: the SLO max rate of its sweep (the same in one sweep)
            best = {(m["name"], m["group"]): json_rate(m["max_rate"]) for m in max_rates}
            for row, result in zip(rows, loaded, strict=True):
                row["slo_max_rate"] = best.get((result.get("name"), group_label(result)))
        for row, ci in zip(rows, confidence_rows(loaded, level), strict=True):
            row["confidence"] = ci
        if predicted_max_rates:
            best = {(m["name"], m["group"]): json_rate(m["max_rate"])
                    for m in predicted_max_rates}
            for row, result in zip(rows, loaded, strict=True):
                row["slo_max_rate_predicted"] = best.get((result.get("name"),
                                                          group_label(result)))
        by_label = {(r["name"], r["label"]): r for r in loads}
        for row, result in zip(rows, loaded, strict=True):
            if (result.get("name"), result.get("label")) in by_label:
                row["under_load"] = by_label[result.get("name"), result.get("label")]
        _print_json(rows)
    else:
        Console().print(report_table(df))
        intervals = confidence_table(loaded, level)
        if intervals is not None:  # some point has two repeats or more
            Console().print(intervals)
        if loads:  # every result with prediction.metrics: the point under its load
            Console().print(under_load_table(loads))
        if variants:  # a scenario with `variants:`: one row per variant
            Console().print(variant_table(variants))
        if speculative:  # points run with `speculative.method` set
            Console().print(spec_table(speculative))
        moe = moe_rows(loaded)
        if moe:  # MoE models: routing measured vs the roofline's uniform routing
            Console().print(moe_table(moe))
        if prefix:  # prefix groups: intended vs measured prefix-cache hit rate
            Console().print(prefix_table(prefix))
        turns = by_turn_rows(loaded)
        if turns:  # workload.kind sessions: latency by turn index (docs/sessions.md)
            Console().print(by_turn_table(turns))
            for line in session_lines(loaded):
                Console().print(line, highlight=False)
        served = server_metrics_rows(loaded)
        if served:  # client runs: the server's own gauges, scraped during the repeats
            Console().print(server_metrics_table(served))
        if goodput:  # points run with `measure.slo`
            Console().print(goodput_table(goodput))
            for summary in max_rates:
                Console().print(max_rate_line(summary), highlight=False)
        for summary in predicted_max_rates:  # the same walk over the simulated points
            Console().print(f"predicted {max_rate_line(summary)}", highlight=False)

    if markdown is not None:
        write_markdown(df, markdown)
    if csv is not None:
        write_csv(df, csv)
    if html is not None:
        from infbench.plots.html.page import write_run_report

        _wrote(html, write_run_report(loaded, html))


def compare(
    baseline: Path = typer.Argument(..., help="Baseline result JSON (or a directory of them)."),
    new: Path = typer.Argument(..., help="New result JSON (or a directory of them)."),
    metric: str = typer.Option("output_tokens_per_s", "--metric",
                               help="Metric path, e.g. output_tokens_per_s, ttft_s.p99, "
                                    "decode.mbu"),
    max_regression: str = typer.Option("5%", "--max-regression", help="5% or 0.05"),
    normalize: str = typer.Option("none", "--normalize",
                                  help="none | mbu | roofline_fraction | reference | "
                                  "torch_reference"),
    decision: str = typer.Option("median", "--decision",
                                 help="median (compare the medians) | confidence (a "
                                      "regression only when the new repeats' whole t "
                                      "interval is beyond the threshold; docs/windows.md)"),
    confidence: str = typer.Option("95%", "--confidence",
                                   help="Level of the t intervals over the repeats shown "
                                        "(and used by --decision confidence): 95% or 0.95."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the verdict as JSON on stdout (same exit codes)."),
    html: Path | None = typer.Option(None, "--html", callback=opt.output_file,
                                     help="Also write the comparison as one self-contained "
                                          "HTML page to FILE (same exit codes)."),
) -> None:
    """Compare two runs; exit 1 if the metric regressed beyond the threshold, 2 on bad input.

    Each row shows the t interval over both sides' repeats and whether they overlap; points
    run with measure.window are compared on their windows (docs/windows.md)."""
    from rich.console import Console

    from infbench.results.confidence import parse_confidence
    from infbench.results.gate import (
        GATE_DECISIONS,
        NORMALIZE_MODES,
        compare_many,
        load_results,
        parse_threshold,
        print_gate,
    )

    _check_outputs(("--html", html))
    if normalize not in NORMALIZE_MODES:
        raise UserError(f"--normalize: unknown value {normalize!r}; "
                        f"allowed: {', '.join(NORMALIZE_MODES)}")
    if decision not in GATE_DECISIONS:
        raise UserError(f"--decision: unknown value {decision!r}; "
                        f"allowed: {', '.join(GATE_DECISIONS)}")
    level = parse_confidence(confidence)
    threshold = parse_threshold(max_regression)
    baselines, news = load_results([baseline]), load_results([new])
    result = compare_many(baselines, news, metric=metric, max_regression=threshold,
                          normalize=normalize, decision=decision, confidence=level)
    if as_json:
        _print_json({"metric": result.metric, "normalize": result.normalize,
                     "max_regression": result.max_regression, "decision": result.decision,
                     "confidence": result.confidence, "passed": result.passed,
                     "exit_code": result.exit_code,
                     "rows": [dataclasses.asdict(row) for row in result.rows],
                     "notes": result.notes})
    else:
        print_gate(result, Console())
    if html is not None:  # written whatever the verdict: a failed gate is worth a look
        from infbench.plots.html.page import write_compare_report

        _wrote(html, write_compare_report(baselines, news, result, html))
    if not result.passed:
        raise typer.Exit(1)


def plots(
    results: list[Path] = typer.Argument(..., help="Result JSON files or directories."),
    out: Path = typer.Option(..., "--out", help="Directory for the figure files."),
    steps: bool = typer.Option(False, "--steps", help="Also put every step on the roofline."),
    size: str = typer.Option("column", "--size",
                             help="column (3.5 in wide, 300 dpi, for a paper) | slide (16:9)."),
    fmt: str = typer.Option("png", "--format", help="png | svg | pdf."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the written paths as JSON on stdout."),
) -> None:
    """Figures of results: latency-throughput, distributions, the measured roofline.

    Speed vs perplexity when the results carry accuracy (quantized or pruned points), speed-up
    against k when they carry speculative metrics, TTFT and TPOT against the request rate
    for a rate sweep, latency and goodput against the rate for one run with measure.slo,
    and the Pareto view (per-user against per-server output tokens/s, one curve per target
    or variant) of two points or more.  Where the results hold prediction.metrics (the
    simulation under load), each of these curves has its predicted twin, dashed."""
    from infbench.plots.analytic import FIGURE_FORMATS, check_size
    from infbench.plots.goodput import goodput_rate_figure
    from infbench.plots.measured import (
        accuracy_speed_figure,
        distributions_figure,
        latency_throughput_figure,
        measured_roofline_figure,
        speculative_figure,
    )
    from infbench.plots.pareto import pareto_figure
    from infbench.plots.rate import latency_rate_figure
    from infbench.results.gate import load_results

    check_size(size)
    if fmt not in FIGURE_FORMATS:
        raise UserError(f"--format: unknown value {fmt!r}; allowed: {', '.join(FIGURE_FORMATS)}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is an existing file; `plots` writes a directory of figures")
    loaded = load_results(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot create the directory ({exc.strerror})") from exc
    # Results of an HTTP target (scenario `target:`) have no engine steps to place on a
    # roofline, and no hardware unless the scenario named one.
    remote = all((r.get("scenario") or {}).get("target") and not r.get("hardware")
                 for r in loaded)
    names = ("latency_throughput", "distributions") + (() if remote else ("roofline_measured",))
    paths = {name: out / f"{name}.{fmt}" for name in names}
    latency_throughput_figure(loaded, paths["latency_throughput"], size=size)
    distributions_figure(loaded, paths["distributions"], size=size)
    if remote:
        print("note: no measured roofline: the results come from an HTTP target with no "
              "hardware (docs/client.md)", file=sys.stderr)
    else:
        measured_roofline_figure(loaded, paths["roofline_measured"], include_steps=steps,
                                 size=size)
    speed_accuracy = out / f"accuracy_speed.{fmt}"  # only when the results carry perplexity
    if accuracy_speed_figure(loaded, speed_accuracy, size=size) is not None:
        paths["accuracy_speed"] = speed_accuracy
    speedup = out / f"speculative_speedup.{fmt}"  # only when the results carry speculative
    if speculative_figure(loaded, speedup, size=size) is not None:
        paths["speculative_speedup"] = speedup
    by_rate = out / f"latency_vs_rate.{fmt}"  # only for two request rates or more
    if latency_rate_figure(loaded, by_rate, size=size) is not None:
        paths["latency_vs_rate"] = by_rate
    goodput = out / f"goodput_rate.{fmt}"  # only for a rate sweep run with measure.slo
    if goodput_rate_figure(loaded, goodput, size=size) is not None:
        paths["goodput_rate"] = goodput
    pareto = out / f"pareto.{fmt}"  # per-user against per-server tok/s: two points or more
    if pareto_figure(loaded, pareto, size=size) is not None:
        paths["pareto"] = pareto
    if as_json:
        _print_json({name: str(path) for name, path in paths.items()})
        return
    for path in paths.values():
        print(path)


def _wrote(path: Path, size: int) -> None:
    """One line on stderr (stdout keeps the table or the JSON)."""
    print(f"wrote {path} ({size / 1e6:.1f} MB, self-contained HTML)", file=sys.stderr)


def _print_json(doc: Any) -> None:
    """One JSON document on stdout; NaN (a metric a run does not have) becomes null."""
    print(json.dumps(_finite(doc), indent=2, allow_nan=False))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _check_outputs(*outputs: tuple[str, Path | None]) -> None:
    """Every file the command will write is checked before any table is printed: a path
    that cannot be written is one error line, not a table followed by one."""
    for option, path in outputs:
        if path is not None:
            check_output_file(path, option)
