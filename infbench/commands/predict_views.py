"""`infbench kv | roofline | models | hardware`: KV footprints, the roofline plot, the tables.

Registered by `infbench.commands.predict` (same family: the analytic model, no torch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from infbench.checkpoint.metadata import config_from_source
from infbench.commands import _options as opt
from infbench.commands.predict import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    KV_BITS_HELP,
    MEM_UTIL_HELP,
    OVERLAP_HELP,
    SET_HELP,
    WORKSPACE_HELP,
    build_quant,
    check_mem_util,
    check_positive,
    default_lengths,
    emit_json,
    fmt_gb,
    fmt_si,
    make_console,
    memory_reserve,
    model_document,
    note_source,
    parallel_config,
    parallel_flags,
    params_line,
    parse_sizes,
    points_of,
)
from infbench.core.errors import UserError
from infbench.measure.model_shapes import model_configs
from infbench.measure.prediction import with_kv_bits
from infbench.plots.analytic import check_size
from infbench.roofline.analysis import OVERLAP_CHOICES
from infbench.roofline.shapes import param_count

SIZE_HELP = "column (3.5 in wide, 300 dpi, for a paper) | slide (16:9)."


def kv_command(
    models: str = typer.Option("llama2-13b,llama3-8b,deepseek-v2-lite", "--models", "--model",
                               callback=opt.name_list,
                               help=f"Models, comma-separated; each is {opt.MODEL_HELP[2:]}"),
    context: int | None = typer.Option(
        None, callback=opt.positive_int,
        help="Context length, tokens per sequence (default: 4096, or the shortest model "
             "context of --models when that is less)."),
    batch: int = typer.Option(8, callback=opt.positive_int, help="Sequences."),
    hardware: str = typer.Option(DEFAULT_HARDWARE, help="Hardware for the max batch."),
    dtype: str = typer.Option("bfloat16", callback=opt.dtype,
                              help=f"Model dtype: {opt.choices(opt.DTYPES)}."),
    kv_dtype: str = typer.Option("none", callback=opt.kv_quant,
                                 help=f"KV cache: {opt.choices(opt.KV_QUANT)}."),
    kv_bits: int | None = typer.Option(None, callback=opt.positive_int, help=KV_BITS_HELP),
    tp: int | None = typer.Option(None, callback=opt.positive_int,
                                  help="Tensor parallel degree: max batch per device group."),
    pp: int | None = typer.Option(None, callback=opt.positive_int, help="Pipeline stages."),
    ep: int | None = typer.Option(None, callback=opt.positive_int,
                                  help="Expert parallel degree within tp."),
    mem_util: float | None = typer.Option(None, callback=check_mem_util, help=MEM_UTIL_HELP),
    workspace_tokens: int | None = typer.Option(
        None, callback=opt.non_negative_int, help=WORKSPACE_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP + " Applies to every "
                                          "model of --models."),
    plot: Path | None = typer.Option(
        None, callback=opt.output_file, help="Write a bar chart here (.png, .svg or .pdf)."),
    size: str = typer.Option("column", "--size", help=SIZE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    results: list[Path] | None = typer.Option(
        None, "--results", help="Result files/directories of `infbench run`: measured "
                                "KV next to the predicted."),
) -> None:
    """KV cache per token and in total, against MHA of the same shape, and the max batch."""
    from infbench.hardware.spec import get_hardware
    from infbench.roofline.tables import kv_rows

    check_size(size)
    if results:
        kv_measured(results, get_hardware(hardware), as_json, plot, size)
        return

    check_positive("--context", context)
    check_positive("--batch", batch)
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise UserError("--models: expected at least one model preset")
    sources = [opt.model_source(name, "--models") for name in names]  # as predict's --model
    configs = [config_from_source(source) for source in sources]  # a refusal before a note
    for source in sources:
        note_source(source)
    if context is None:
        shortest = min(cfg.max_seq_len for cfg in configs)
        context = min(4096, shortest)
        if context < 4096:
            print(f"note: --context {context}, the shortest model context of --models",
                  file=sys.stderr)
    quant = build_quant(None, None, kv_dtype, kv_bits=kv_bits)
    par = parallel_config(tp, pp, ep, None)
    if set_:  # the same document and parser as predict, roofline and run, once per model
        points = [points_of(model_document("kv", name, set_, hardware=hardware, dtype=dtype,
                                           quant={"kv": kv_dtype},
                                           parallel=parallel_flags(tp, pp, ep, None)))[0]
                  for name in names]
        configs = model_configs(points)
        hardware, dtype = points[0].hardware, points[0].dtype
        quant, par = with_kv_bits(points[0].quant_config(), kv_bits), points[0].parallel
    else:  # flags only, checked by their option validators: no schema to load
        configs = [config_from_source(source) for source in sources]
    rows = kv_rows(configs, context_len=context, batch=batch, hw=get_hardware(hardware),
                   dtype=dtype, quant=quant, parallel=par,
                   reserve=memory_reserve(mem_util, workspace_tokens))
    if plot is not None:
        from infbench.plots.analytic import kv_figure

        kv_figure(rows, plot, size=size, dtype=dtype, hardware=hardware)
        print(f"wrote {plot}", file=sys.stderr)
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return
    from rich.table import Table

    kv_name = f"{kv_bits}-bit" if kv_bits is not None else kv_dtype
    where = hardware if par.trivial else f"{par.devices_per_replica} x {hardware} (tp {par.tp}, " \
        f"pp {par.pp})"
    table = Table(title=f"KV cache at {context} tokens x batch {batch} ({dtype}, kv {kv_name}; "
                        f"max batch on {where})")
    for col in ("model", "attention", "KV heads", "KV B/token", "KV GB", "MHA GB",
                "reduction", "state B/seq", "max batch"):
        left = col in ("model", "attention")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for r in rows:
        table.add_row(r.model, r.attention, str(r.kv_heads), f"{r.kv_bytes_per_token:,}",
                      fmt_gb(r.kv_cache_bytes), fmt_gb(r.mha_kv_cache_bytes), f"{r.reduction:.1f}x",
                      f"{r.state_bytes_per_seq:,}", str(r.max_batch))
    console = make_console()
    console.print(table)
    for cfg in configs:
        params = param_count(cfg)
        if params.mtp:
            console.print(params_line(cfg.name, params), highlight=False)


def roofline_command(
    results: list[Path] | None = typer.Argument(
        None, help="Result files or directories of `infbench run`: plot their measured "
                   "prefill/decode points next to their predictions."),
    model: str = typer.Option(DEFAULT_MODEL, callback=opt.non_empty, help=opt.MODEL_HELP),
    hardware: str | None = typer.Option(
        None, callback=opt.non_empty,
        help=f"Hardware (default {DEFAULT_HARDWARE}; with result files: the one each "
                   "run was analysed against)."),
    steps: bool = typer.Option(False, "--steps", help="With result files: every step too."),
    batch: str = typer.Option(
        "1,8,64", callback=opt.positive_int_list, help="Batch sizes, comma-separated."),
    prompt: int | None = typer.Option(
        None, callback=opt.positive_int, help="Prompt tokens (default: 1024)."),
    gen: int | None = typer.Option(
        None, callback=opt.positive_int, help="Generated tokens (default: 128)."),
    dtype: str = typer.Option("bfloat16", callback=opt.dtype,
                              help=f"Model dtype: {opt.choices(opt.DTYPES)}."),
    quant: str = typer.Option("none", callback=opt.weight_quant,
                              help=f"Weights: {opt.choices(opt.WEIGHT_QUANT)}."),
    kv_dtype: str = typer.Option("none", callback=opt.kv_quant,
                                 help=f"KV cache: {opt.choices(opt.KV_QUANT)}."),
    kv_bits: int | None = typer.Option(None, callback=opt.positive_int, help=KV_BITS_HELP),
    tp: int | None = typer.Option(None, callback=opt.positive_int,
                                  help="Tensor parallel degree (points: one device's share)."),
    pp: int | None = typer.Option(None, callback=opt.positive_int, help="Pipeline stages."),
    ep: int | None = typer.Option(None, callback=opt.positive_int,
                                  help="Expert parallel degree within tp."),
    overlap: str = typer.Option("auto", callback=opt.one_of(OVERLAP_CHOICES),
                                help=OVERLAP_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    out: Path = typer.Option(Path("roofline.png"), callback=opt.output_file,
                             help="Figure to write (.png, .svg or .pdf)."),
    with_ops: bool = typer.Option(True, "--ops/--no-ops", help="Plot every operator too."),
    size: str = typer.Option("column", "--size", help=SIZE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Plot prefill, decode and every operator on the hardware's roofline."""
    from infbench.hardware.spec import get_hardware
    from infbench.plots.analytic import check_figure_path, roofline_figure
    from infbench.roofline.analysis import check_context, predict
    from infbench.roofline.tables import roofline_points

    check_figure_path(out, "--out")  # before any work: a typo'd extension fails at once
    check_size(size)
    if results:
        measured_roofline(results, hardware, steps, out, as_json, size)
        return
    hardware = hardware or DEFAULT_HARDWARE
    check_positive("--prompt", prompt)
    check_positive("--gen", gen)
    prompt, gen, note = default_lengths(config_from_source(opt.model_source(model)), prompt, gen)
    hw = get_hardware(hardware)  # an unknown name: the table's allowed list
    if set_:  # one model, hardware, dtype and quant per plot; --set may change any of them
        doc = model_document("roofline", model, set_, hardware=hardware, dtype=dtype,
                             quant={"weights": quant, "kv": kv_dtype},
                             workload={"prompt_len": prompt, "gen_len": gen},
                             parallel=parallel_flags(tp, pp, ep, None))
        point = points_of(doc)[0]
        model_dict, cfg = point.model_source(), model_configs([point])[0]
        qcfg, par = with_kv_bits(point.quant_config(), kv_bits), point.parallel
        hw, dtype = get_hardware(point.hardware), point.dtype
        prompt, gen = point.workload.prompt_len, point.workload.gen_len
    else:  # flags only, checked by their option validators: no schema to load
        model_dict = opt.model_source(model)
        cfg = config_from_source(model_dict)
        qcfg = build_quant(quant, None, kv_dtype, model_dict, kv_bits)
        par = parallel_config(tp, pp, ep, None)
    note_source(model_dict)
    check_context(cfg, prompt, gen)
    predictions = [predict(cfg, hw, batch=b, prompt_len=prompt, gen_len=gen, dtype=dtype,
                           quant=qcfg, parallel=par, overlap=overlap)
                   for b in parse_sizes(batch, "--batch")]
    if note:
        print(note, file=sys.stderr)
    points = roofline_points(predictions, include_ops=with_ops)
    drawn = roofline_figure(hw, dtype, points, out, size=size,
                            title=f"Roofline, prompt {prompt} / gen {gen} tokens", model=cfg.name)
    if as_json:
        emit_json({
            "hardware": hw.name,
            "dtype": dtype,
            "peak_flops_per_s": hw.peak(dtype),
            "bandwidth_bytes_per_s": hw.bandwidth,
            "ridge_point": hw.ridge_point(dtype),
            "out_path": drawn["out_path"],
            "points": [{"label": p.label, "stage": p.stage, "batch": p.batch,
                        "intensity": p.intensity, "flops_per_s": p.flops_per_s,
                        "kind": p.kind, "group": p.group} for p in points],
        })
        return
    from rich.table import Table

    table = Table(title=f"{cfg.name} on {hw.name} ({dtype}): ridge point "
                        f"{hw.ridge_point(dtype):.0f} FLOP/B; wrote {drawn['out_path']}")
    for col in ("point", "FLOP/B", "FLOP/s", "of peak"):
        table.add_column(col, justify="left" if col == "point" else "right")
    for p in points:
        if p.series.endswith("(step)"):
            table.add_row(p.label, f"{p.intensity:.3g}", fmt_si(p.flops_per_s),
                          f"{p.flops_per_s / hw.peak(dtype):.1%}")
    make_console().print(table)


def models_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """List the model presets."""
    from infbench.roofline.tables import model_rows

    rows = model_rows()
    if as_json:
        emit_json(rows)
        return
    from rich.table import Table

    table = Table(title="Model presets (KV bytes per token in bfloat16)")
    for col in ("model", "params", "active", "layers", "hidden", "heads/kv", "attention",
                "KV B/token"):
        left = col in ("model", "attention")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for r in rows:
        table.add_row(r["model"], fmt_si(r["params"]), fmt_si(r["active_params"]),
                      str(r["layers"]), str(r["hidden"]), f"{r['heads']}/{r['kv_heads']}",
                      r["attention"], f"{r['kv_bytes_per_token_bf16']:,}")
    make_console().print(table)


def hardware_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """List the hardware table (dense peaks, bandwidth, memory, ridge point)."""
    from infbench.roofline.tables import hardware_rows

    rows = hardware_rows()
    if as_json:
        emit_json(rows)
        return
    from rich.table import Table

    table = Table(title="Hardware (decimal units; dense peaks; memory as the device reports "
                        "it, usable at 0.95 utilization; link per direction; devices in the "
                        "link domain / per node)")
    for col in ("hardware", "bf16 FLOP/s", "fp32 FLOP/s", "fp8 FLOP/s", "fp4 FLOP/s",
                "bandwidth B/s", "memory GB", "usable GB", "ridge bf16", "link B/s",
                "domain / node"):
        left = col == "hardware"
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for r in rows:
        peaks = r["peak_flops"]
        net = r["interconnect"]
        table.add_row(r["hardware"], fmt_si(peaks["bfloat16"]),
                      *(fmt_si(peaks[k]) if k in peaks else "-"
                        for k in ("float32", "float8", "float4")),
                      fmt_si(r["bandwidth_bytes_per_s"]), fmt_gb(r["memory_bytes"]),
                      fmt_gb(r["usable_memory_bytes"]), f"{r['ridge_point_bf16']:.0f}",
                      f"{net['link']} {fmt_si(net['link_bytes_per_s'])}" if net else "-",
                      f"{net['link_domain']} / {net['devices_per_node']}" if net else "-")
    console = make_console()
    console.print(table)
    for r in rows:
        console.print(f"{r['hardware']}: {r['source']}", highlight=False)

def register(app: typer.Typer) -> None:
    app.command("kv")(kv_command)
    app.command("roofline")(roofline_command)
    app.command("models")(models_command)
    app.command("hardware")(hardware_command)


def measured_roofline(paths: list[Path], hardware: str | None, steps: bool, out: Path,
                      as_json: bool, size: str = "column") -> None:
    """`infbench roofline RESULTS...`: measured points and their predicted twins."""
    from rich.table import Table

    from infbench.hardware.spec import get_hardware
    from infbench.plots.measured import measured_roofline_figure
    from infbench.results.gate import load_results

    runs = load_results([str(p) for p in paths])
    hw = get_hardware(hardware) if hardware else None
    drawn = measured_roofline_figure(runs, out, hardware=hw, include_steps=steps, size=size)
    hw_name = hw.name if hw else (runs[0].get("hardware") or {}).get("name", "?")
    ridge = drawn["ridge_point"]["intensity"]
    if as_json:
        emit_json({"hardware": hw_name, "peak_flops_per_s": drawn["peak_flops_per_s"],
                   "bandwidth_bytes_per_s": drawn["bandwidth_bytes_per_s"],
                   "ridge_point": ridge, "out_path": drawn["out_path"],
                   "points": drawn["points"], "links": drawn["links"]})
        return
    table = Table(title=f"measured vs predicted on {hw_name}: ridge point {ridge:.1f} FLOP/B; "
                        f"wrote {drawn['out_path']}")
    for col in ("point", "kind", "FLOP/B", "GFLOP/s"):
        table.add_column(col, justify="left" if col in ("point", "kind") else "right")
    for p in drawn["points"]:
        if p.get("series", "").endswith("(step)"):
            continue
        table.add_row(p["label"], p["kind"], f"{p['intensity']:.2f}",
                      f"{p['flops_per_s'] / 1e9:.2f}")
    make_console().print(table)


def kv_measured(paths: list[Path], hw: Any, as_json: bool, plot: Path | None = None,
                size: str = "column") -> None:
    """`infbench kv --results`: allocated KV and state next to the analytic values."""
    from rich.table import Table

    from infbench.results.gate import load_results
    from infbench.results.kv_report import kv_measured_rows

    rows = kv_measured_rows(load_results([str(p) for p in paths]), hw)
    if plot is not None:
        from infbench.plots.analytic import kv_measured_figure

        kv_measured_figure(rows, plot, size=size, hardware=hw.name)
        print(f"wrote {plot}", file=sys.stderr)
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"KV cache: measured (engine) vs predicted; max batch on {hw.name}")
    for col in ("scheme", "context", "KV B/token pred", "KV B/token meas", "state B/seq",
                "KV MB pred", "peak KV MB meas", "max batch", "decode tok/s", "TTFT p50 ms"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    for r in rows:
        ok = r["kv_bytes_per_token_measured"] == r["kv_bytes_per_token_predicted"]
        state_ok = r["state_bytes_per_seq_measured"] == r["state_bytes_per_seq_predicted"]
        tps = r["decode_tokens_per_s_measured"]
        table.add_row(
            r["scheme"], f"{r['context_len']:,}", f"{r['kv_bytes_per_token_predicted']:,}",
            f"{r['kv_bytes_per_token_measured']:,}{'' if ok else ' (!)'}",
            f"{r['state_bytes_per_seq_measured']:,}{'' if state_ok else ' (!)'}",
            f"{r['kv_cache_bytes_predicted'] / 1e6:.2f}",
            f"{r['peak_kv_bytes_measured'] / 1e6:.2f}",
            str(r["max_batch_predicted"]), "-" if tps is None else f"{tps:.1f}",
            "-" if r["ttft_p50_s_measured"] is None else f"{r['ttft_p50_s_measured'] * 1e3:.1f}")
    make_console().print(table)
