"""`infbench predict | kv | roofline | models | hardware`: the analytic model on the command line.

Everything here is parsing and printing; the numbers come from `infbench.measure.prediction`
(a point's price, the same `run` records) over `infbench.roofline`.
No torch anywhere on these paths, so the commands start in a fraction of a second.
`--json` prints JSON (and only JSON) on stdout.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

from infbench.checkpoint.metadata import config_from_source
from infbench.commands import _options as opt
from infbench.core.config import MAX_BATCH
from infbench.core.errors import UserError
from infbench.core.parallel import DISPATCH_DTYPES
from infbench.measure.model_shapes import model_configs
from infbench.measure.prediction import (
    PointPrice,
    PricedWorkload,
    PricingOptions,
    price,
    price_points,
)
from infbench.roofline.analysis import OVERLAP_CHOICES, Prediction

DEFAULT_MODEL = "llama2-13b"
DEFAULT_HARDWARE = "h100-sxm"
SET_HELP = ("KEY=VALUE: a dotted scenario key with a YAML value, as in `run` "
            "(model.overrides.num_layers=20, model.attention.kind=mla, hardware=a100-80gb); "
            "repeatable.")
# Attention-kind-specific flags and the kinds that read them.
_KIND_FLAGS = {
    "kv_heads": ("gqa", "cla", "sliding", "linear", "ssm"),
    "window": ("sliding",),
    "global_every": ("sliding",),
    "cla_group": ("cla",),
    "kv_lora_rank": ("mla",),
    "q_lora_rank": ("mla",),
    "feature_map": ("linear",),
    "feature_dim": ("linear",),
    "d_state": ("ssm",),
    "attn_every": ("linear", "ssm"),
}


def parse_sizes(text: str, flag: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; every size must be a positive integer."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not sizes:
        raise UserError(f"{flag}: expected at least one size")
    for size in sizes:
        check_positive(flag, size)
    return sizes


def check_positive(flag: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{flag} must be > 0, got {value}")


COMMAND_LINE = "command line"  # the source named in errors about flags and --set
OVERLAP_HELP = ("How a step's operators share the roofline: full (one roofline over the "
                "step) | none (the sum of each operator's own roofline) | auto (the default: "
                "none on a profile from `infbench calibrate`, full on datasheet hardware).")
MEM_UTIL_HELP = ("Fraction of the device's reported memory the model may use, as vLLM's "
                 "gpu_memory_utilization (default: 0.95).")
WORKSPACE_HELP = ("Tokens whose activations are held back as workspace (default: 2048; "
                  "0: no workspace and no logits buffer).")
KV_BITS_HELP = "Bits per cached K/V value, any width 1-32 (analytic only; e.g. 6)."
EFFICIENCY_HELP = ("Derate the datasheet peaks: a fraction in (0, 1] of the bandwidth and "
                   "compute peaks, or an engine (gpt-fast | vllm | sglang | tensorrt-llm): the "
                   "fractions fitted on its published measurements, with their leave-one-out "
                   "error (docs/fidelity.md). Default: none, the pure roofline.")


def default_lengths(cfg: Any, prompt: int | None, gen: int | None,
                    defaults: tuple[int, int] = (1024, 128)) -> tuple[int, int, str]:
    """--prompt / --gen, their defaults shortened to fit a model whose context is shorter
    than 1024 + 128, and the note that says so (print it once the prediction succeeded);
    values given on the command line are kept as given (the prediction then refuses what
    does not fit)."""
    prompt_len = defaults[0] if prompt is None else prompt
    gen_len = defaults[1] if gen is None else gen
    limit = cfg.max_seq_len
    if prompt_len + gen_len <= limit or (prompt is not None and gen is not None):
        return prompt_len, gen_len, ""
    if prompt is None:
        prompt_len = max(1, limit - gen_len)
    if gen is None and prompt_len + gen_len > limit:
        gen_len = max(1, limit - prompt_len)
    if prompt_len + gen_len > limit:
        return prompt_len, gen_len, ""
    return prompt_len, gen_len, (f"note: {cfg.name} holds {limit} tokens of context: "
                                 f"predicting --prompt {prompt_len} --gen {gen_len}")


def _a2a_links(a2a: Any) -> str:
    """Where an all-to-all runs: one link, or the network between nodes and the link in."""
    if a2a.nodes == 1:
        return str(a2a.tier)
    return (f"{a2a.tier} between {a2a.nodes} nodes ({a2a.remote_nodes:.3g} per token, "
            f"{fmt_si(a2a.network_bytes)}B) and {a2a.link_tier} in them")


def parallel_config(tp: int | None, pp: int | None, ep: int | None, replicas: int | None,
                    microbatches: int | None = None, attention_dp: int | None = None,
                    dispatch_dtype: str | None = None, dense_dp: bool = False) -> Any:
    """The ParallelConfig of the flags (unset: the config's defaults)."""
    from infbench.core.parallel import ParallelConfig

    return ParallelConfig(tp or 1, pp or 1, ep or 1, replicas or 1, microbatches,
                          attention_dp or 1, dispatch_dtype or "model", dense_dp)


def parallel_flags(tp: int | None, pp: int | None, ep: int | None, replicas: int | None,
                   microbatches: int | None = None, attention_dp: int | None = None,
                   dispatch_dtype: str | None = None, dense_dp: bool = False
                   ) -> dict[str, int | str | bool]:
    """The `parallel:` keys the flags set (for a scenario-shaped document)."""
    values = {"tp": tp, "pp": pp, "ep": ep, "replicas": replicas, "microbatches": microbatches,
              "attention_dp": attention_dp, "dispatch_dtype": dispatch_dtype,
              "dense_dp": dense_dp or None}
    return {k: v for k, v in values.items() if v is not None}


def memory_reserve(mem_util: float | None, workspace_tokens: int | None) -> Any:
    from infbench.hardware.spec import MemoryReserve

    default = MemoryReserve()
    return MemoryReserve(default.utilization if mem_util is None else mem_util,
                         default.workspace_tokens if workspace_tokens is None
                         else workspace_tokens)


def check_mem_util(value: float | None) -> float | None:
    """--mem-util: a fraction in (0, 1]."""
    if value is not None and not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise typer.BadParameter(f"must be in (0, 1] (got {value})")
    return value


def model_document(command: str, model: str, sets: list[str] | None, *,
                   hardware: str | None = None, dtype: str | None = None,
                   quant: dict[str, Any] | None = None,
                   workload: dict[str, Any] | None = None,
                   parallel: dict[str, Any] | None = None,
                   engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Flags + `--set` -> a scenario-shaped document (validated by the scenario schema).

    `--model` becomes `model: {preset|path|gguf: ...}` exactly as in a scenario file, and
    `--set` items are applied by the scenario's own parser, so `--set model.overrides.x=1`
    means the same in `predict`, `roofline` and `run`.
    """
    from infbench.scenario.schema import apply_sets

    doc: dict[str, Any] = {
        "name": command,
        "model": {**opt.model_source(model),
                  "quant": {k: v for k, v in (quant or {}).items() if v is not None}},
        "workload": dict(workload or {}),
    }
    if hardware is not None:
        doc["hardware"] = hardware
    if dtype is not None:
        doc["dtype"] = dtype
    if parallel:
        doc["parallel"] = dict(parallel)
    if engine:
        doc["engine"] = dict(engine)
    apply_sets(doc, sets or [], COMMAND_LINE)
    return doc


def points_of(doc: dict[str, Any]) -> list[Any]:
    """The validated points of a document, each with its ModelConfig read once per source."""
    from infbench.scenario.schema import scenario_from_document

    return scenario_from_document(doc, COMMAND_LINE).points()


def source_label(model: dict[str, Any]) -> str:
    """'preset llama2-13b' | 'hf DIR (config.json)' | 'gguf FILE (metadata)': what was read."""
    if "preset" in model:
        return f"preset {model['preset']}"
    if "path" in model:
        return f"hf {model['path']} (config.json)"
    return f"gguf {model['gguf']} (metadata)"


def note_source(model: dict[str, Any]) -> None:
    """Name a checkpoint the shapes came from (a preset name says it already)."""
    if "preset" not in model:
        print(f"note: model shapes from {source_label(model)}; weights are not read",
              file=sys.stderr)


def attention_values(cfg: Any, attention: str | None,
                     flags: dict[str, Any]) -> dict[str, Any] | None:
    """The `model.attention` keys the attention flags ask for, or None when they change nothing.

    A flag only one kind reads switches a full-attention model to that kind (--window ->
    sliding, --kv-heads on MHA -> gqa), so the model's own kind is read first.
    """
    given = {k: v for k, v in flags.items() if v is not None}
    current = cfg.attention.kind
    kind = attention
    if kind is None:
        if "window" in given and current in ("mha", "gqa", "mqa"):
            kind = "sliding"
        elif "kv_heads" in given and current in ("mha", "mqa"):
            kind = "gqa"
    kind = kind or current
    for name in given:
        if kind not in _KIND_FLAGS[name]:
            raise UserError(
                f"--{name.replace('_', '-')} applies to --attention "
                f"{' | '.join(_KIND_FLAGS[name])}, not {kind!r}"
            )
    if kind == current and not given:
        return None
    values: dict[str, Any] = {"kind": kind, **given}
    if kind != current and kind in _KIND_FLAGS["kv_heads"]:
        values.setdefault("kv_heads", cfg.kv_heads)  # switching kinds keeps the KV heads
    return values


def apply_attention_flags(doc: dict[str, Any], attention: str | None,
                          flags: dict[str, Any]) -> list[Any]:
    """Map the attention flags onto `model.attention` of `doc` (after --set); its points."""
    points = points_of(doc)
    if attention is None and all(v is None for v in flags.values()):
        return points
    values = attention_values(model_configs(points[:1])[0], attention, flags)
    if values is None:
        return points
    section = doc["model"].setdefault("attention", {})
    if not isinstance(section, dict) or section.get("kind", values["kind"]) != values["kind"]:
        section = doc["model"]["attention"] = {}  # --attention replaces a --set of another kind
    section.update(values)
    return points_of(doc)


def build_quant(quant: str | None, group_size: int | None, kv_dtype: str | None,
                source: dict[str, str] | None = None, kv_bits: int | None = None,
                activations: str | None = None, fp8_scales: str | None = None) -> Any:
    """The QuantConfig of the flags; `--quant native` reads the model's stored formats (a
    GGUF file's tensor types, a safetensors checkpoint's quantization_config)."""
    from infbench.checkpoint.metadata import native_quant
    from infbench.core.config import make_quant

    check_positive("--group-size", group_size)
    qcfg = make_quant({"weights": quant or "none", "group_size": group_size or 128,
                       "kv": kv_dtype or "none", "kv_bits": kv_bits,
                       "activations": activations or "float", "fp8_scales": fp8_scales})
    return native_quant(qcfg, source) if source is not None else qcfg


def build_spec(tokens: int | None, acceptance: float | None, ratio: float | None) -> Any:
    from infbench.core.speculative import SpeculativeConfig

    if tokens is None and acceptance is None and ratio is None:
        return None
    if tokens is None or acceptance is None:
        raise UserError("speculative decoding needs both --spec-tokens and --spec-acceptance")
    # the flags price any proposer: g drafts at acceptance a, each costing c target steps
    return SpeculativeConfig("draft" if ratio else "ngram", tokens, acceptance, ratio or 0.0)


def _one_or_list(sizes: list[int]) -> int | list[int]:
    """A single size is a plain value, so its point is not labelled as a sweep in errors."""
    return sizes[0] if len(sizes) == 1 else sizes


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def fmt_gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def fmt_si(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        # compare after rounding to 3 digits: 999.9M is "1G", not "1e+03M" (gemma-3-1b)
        if float(f"{abs(value) / scale:.3g}") >= 1:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def params_line(model: str, params: Any) -> str:
    """`deepseek-v3: 671G parameters (36.6G active) + 13.5G MTP = 684G stored`: a checkpoint's
    multi-token-prediction modules beside the main model (not in its count)."""
    return (f"{model}: {fmt_si(params.total)} parameters ({fmt_si(params.active)} active) + "
            f"{fmt_si(params.mtp)} MTP = "
            f"{fmt_si(params.total + params.mtp)} stored; the MTP runs as speculative.method: mtp")


def make_console(min_width: int = 120) -> Any:
    """A rich console at least `min_width` columns wide: tables stay readable when piped."""
    from rich.console import Console

    width = Console().width
    return Console(width=max(width, min_width))


def _layout(par: Any) -> str:
    """tp x pp, the attention dp, the replicas: `8x1 dp8 x2`."""
    return (f"{par.tp}x{par.pp}" + (f" dp{par.attention_dp}" if par.attention_dp > 1 else "")
            + (f" x{par.replicas}" if par.replicas > 1 else ""))


def _devices(p: Prediction) -> str:
    pools = p.parallel.disaggregated
    if pools is not None:
        return f"P {_layout(pools.prefill)} + D {_layout(pools.decode)}"
    return _layout(p.parallel)


def print_predictions(prices: list[PointPrice], show_ops: bool,
                      labels: list[str] | None = None) -> None:
    from rich.table import Table

    # 11 columns, 12 with the sweep labels: wide enough that none is cropped or squeezed away
    console = make_console(160)
    table = Table(title="Roofline prediction (ms; GB; bound: prefill/decode)",
                  caption="decode tok/s = batch / TPOT (decode steps only); e2e tok/s = "
                          "requests x gen / wall time (waves of batch back to back, prefill "
                          "included, as in run)")
    labels = labels or [""] * len(prices)
    priced = [(label, pp, pp.prediction) for label, pp in zip(labels, prices, strict=True)
              if pp.prediction is not None]
    predictions = [p for _, _, p in priced]
    show_labels = any(labels)
    show_devices = any(not p.parallel.trivial for p in predictions)
    if show_labels:
        table.add_column("point", overflow="fold", min_width=12, max_width=26)
    cols = ["model", "hardware", *(["tp x pp"] if show_devices else []), "batch", "prompt/gen",
            "memory", "max batch", "TTFT", "TPOT", "decode tok/s", "e2e tok/s", "bound"]
    for col in cols:
        left = col in ("model", "hardware")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for label, pp, p in priced:
        memory = fmt_gb(p.memory_bytes) if p.fits else f"[red]{fmt_gb(p.memory_bytes)}[/red]"
        decodes = p.gen_len > 1  # --gen 1: the one token comes from the prefill
        table.add_row(
            *([label] if show_labels else []),
            p.model, p.hardware, *([_devices(p)] if show_devices else []), str(p.batch),
            f"{p.prompt_len}/{p.gen_len}", memory, str(p.max_batch), fmt_ms(p.ttft_s),
            fmt_ms(p.time_per_token_s) if decodes else "-",
            f"{p.tokens_per_s:,.0f}" if decodes else "-",
            f"{pp.to_dict()['output_tokens_per_s']:,.0f}",
            f"{p.prefill.bound[0]}/{p.decode.bound[0] if decodes else '-'}",
        )
    if priced:
        console.print(table)
    for label, pp in zip(labels, prices, strict=True):
        if pp.prediction is None and pp.metrics is None:  # simulated: the next table
            console.print(f"{label or 'point'}: {pp.note}", highlight=False)
    for _, pp, p in priced:
        _print_details(console, pp, p)
    if show_ops:
        for p in predictions:
            _print_ops(console, p)


def _print_details(console: Any, pp: PointPrice, p: Prediction) -> None:
    """The lines under the table: memory that does not fit, waves, parallel, speculative."""
    if not p.fits:
        per = " per device" if p.parallel.devices_per_replica > 1 else ""
        console.print(
            f"[red]{p.model} b={p.batch} needs {fmt_gb(p.memory_bytes)} GB{per} + "
            f"{fmt_gb(p.workspace_bytes)} GB workspace; {p.hardware} has "
            f"{fmt_gb(p.usable_memory_bytes)} GB usable of "
            f"{fmt_gb(p.memory_capacity_bytes)} GB[/red]")
    w = pp.workload
    if w is not None and w.waves > 1:
        how = "pipelined through the pools" if p.disaggregated else "back to back"
        console.print(f"{p.model} b={p.batch}: {w.num_sequences} requests in {w.waves} waves "
                      f"of {p.batch}, {how} (e2e tok/s over all of them)", highlight=False)
    if p.disaggregated is not None:
        _print_pools(console, p)
    elif not p.parallel.trivial:
        par = p.parallel
        comm = p.decode_comm
        dp = f", attention dp {par.attention_dp}" if par.attention_dp > 1 else ""
        dp += ", dense dp" if par.dense_dp else ""
        console.print(
            f"{p.model} b={p.batch} on {par.devices} x {p.hardware} (tp {par.tp}, pp "
            f"{par.pp}, ep {par.ep}{dp}, replicas {par.replicas}): decode communication "
            f"{fmt_ms(comm.total_s)} ms of {fmt_ms(p.decode.time_s)} ms per step"
            + (f", pipeline bubble {p.pipeline_bubble:.0%}" if par.pp > 1 else ""),
            highlight=False)
    if not p.parallel.trivial:
        for stage, a2a in (("prefill", p.prefill_all_to_all), ("decode", p.decode_all_to_all)):
            if a2a is not None:
                console.print(
                    f"{p.model} b={p.batch} {stage} all-to-all per MoE layer ({a2a.moe_layers} "
                    f"layers), per device: {a2a.tokens:,.6g} tokens x top-{a2a.top_k}, "
                    f"dispatch {fmt_si(a2a.dispatch_bytes)}B ({a2a.dispatch_dtype}) + combine "
                    f"{fmt_si(a2a.combine_bytes)}B over {_a2a_links(a2a)} (ep {a2a.group}): "
                    f"{fmt_ms(a2a.time_s)} ms per layer", highlight=False)
    if p.speculative is not None:
        s = p.speculative
        console.print(
            f"{p.model} b={p.batch}: speculative g={s.config.num_tokens} "
            f"a={s.config.acceptance}: {s.expected_tokens_per_step:.2f} tokens/step, "
            f"{fmt_ms(s.step_time_s)} ms/step, {s.speedup:.2f}x over plain decode"
        )
    if p.params.mtp:
        console.print(params_line(p.model, p.params), highlight=False)
    if pp.note:
        console.print(f"note: {p.model} b={p.batch}: {pp.note}", highlight=False)


def _print_pools(console: Any, p: Prediction) -> None:
    """A disaggregated prediction's pools, the KV transfer and the throughput per device."""
    d = p.disaggregated
    assert d is not None
    head = f"{p.model} b={p.batch} disaggregated"
    for name, pool in (("prefill", d.prefill), ("decode", d.decode)):
        fit = "" if pool.fits else " [red](does not fit)[/red]"
        console.print(
            f"{head}: {name} pool {pool.instances} x {pool.devices // pool.instances} "
            f"devices: {fmt_ms(pool.batch_time_s)} ms per batch, {pool.requests_per_s:,.1f} "
            f"requests/s, {fmt_gb(pool.memory_bytes)} GB per device{fit}", highlight=False)
    t = d.transfer
    console.print(
        f"{head}: KV transfer {fmt_gb(t.bytes)} GB over {t.tier} on {t.links} links: "
        f"{fmt_ms(t.time_s)} ms (in TTFT); {d.requests_per_s * p.gen_len:,.0f} output tok/s "
        f"on {d.devices} devices ({d.requests_per_s * p.gen_len / d.devices:,.1f} per "
        f"device), bound by the {d.bound} pool", highlight=False)


def _print_ops(console: Any, p: Prediction) -> None:
    from rich.table import Table

    ops = Table(title=f"{p.model} on {p.hardware}, batch {p.batch}: per operator "
                      "(decode: mean step)")
    for col in ("stage", "op", "FLOPs", "bytes", "FLOP/B", "time (ms)", "bound"):
        ops.add_column(col, justify="left" if col in ("stage", "op") else "right")
    for stage in (p.prefill, p.decode) if p.gen_len > 1 else (p.prefill,):
        for op in stage.ops:
            ops.add_row(stage.stage, op.cost.name, fmt_si(op.cost.flops), fmt_si(op.cost.bytes),
                        f"{op.cost.intensity:.3g}", fmt_ms(op.time_s), op.bound)
    console.print(ops)


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_command)


def predict_command(
    scenario: Path | None = typer.Argument(None, help="A scenario YAML; its points replace "
                                           "the model/workload flags."),
    model: str | None = typer.Option(
        None, callback=opt.non_empty, help=f"{opt.MODEL_HELP} (default: {DEFAULT_MODEL})"),
    hardware: str | None = typer.Option(
        None, callback=opt.non_empty, help=f"Hardware (default: {DEFAULT_HARDWARE})."),
    batch: str | None = typer.Option(
        None, callback=opt.positive_int_list, help="Batch sizes, comma-separated (default: 1)."),
    prompt: int | None = typer.Option(
        None, callback=opt.positive_int, help="Prompt tokens (default: 1024)."),
    gen: int | None = typer.Option(
        None, callback=opt.positive_int, help="Generated tokens (default: 128)."),
    dtype: str | None = typer.Option(
        None, callback=opt.dtype,
        help=f"Model dtype: {opt.choices(opt.DTYPES)} (default: bfloat16)."),
    kv_heads: int | None = typer.Option(
        None, callback=opt.positive_int, help="KV heads (GQA; switches MHA to gqa)."),
    attention: str | None = typer.Option(
        None, callback=opt.attention_kind, help=opt.choices(opt.ATTENTION_KINDS)),
    window: int | None = typer.Option(
        None, callback=opt.positive_int, help="Sliding window (switches to sliding)."),
    global_every: int | None = typer.Option(
        None, callback=opt.positive_int, help="Sliding: every Nth layer is global."),
    cla_group: int | None = typer.Option(
        None, callback=opt.positive_int, help="CLA: layers sharing one KV."),
    kv_lora_rank: int | None = typer.Option(
        None, callback=opt.positive_int, help="MLA latent rank."),
    q_lora_rank: int | None = typer.Option(None, callback=opt.positive_int, help="MLA query rank."),
    feature_map: str | None = typer.Option(
        None, callback=opt.feature_map, help=f"Linear: {opt.choices(opt.FEATURE_MAPS)}."),
    feature_dim: int | None = typer.Option(
        None, callback=opt.positive_int, help="Linear: feature dimension."),
    d_state: int | None = typer.Option(None, callback=opt.positive_int, help="SSM state size."),
    attn_every: int | None = typer.Option(
        None, callback=opt.positive_int, help="Linear/SSM: every Nth layer attends."),
    quant: str | None = typer.Option(
        None, callback=opt.weight_quant, help=f"Weights: {opt.choices(opt.WEIGHT_QUANT)}."),
    group_size: int | None = typer.Option(
        None, callback=opt.positive_int, help="int4 group size (default: 128)."),
    activations: str | None = typer.Option(
        None, callback=opt.activation_quant, help=opt.ACTIVATIONS_HELP),
    fp8_scales: str | None = typer.Option(
        None, callback=opt.fp8_scales, help=opt.FP8_SCALES_HELP),
    kv_dtype: str | None = typer.Option(
        None, callback=opt.kv_quant, help=f"KV cache: {opt.choices(opt.KV_QUANT)}."),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    spec_tokens: int | None = typer.Option(
        None, callback=opt.positive_int, help="Speculative: draft tokens g."),
    spec_acceptance: float | None = typer.Option(
        None, callback=opt.unit_interval, help="Speculative: acceptance rate."),
    spec_draft_ratio: float | None = typer.Option(
        None, callback=opt.non_negative_float,
        help="Speculative: draft/target step cost (default: 0, free drafts)."),
    tp: int | None = typer.Option(
        None, callback=opt.positive_int, help="Tensor parallel degree (default: 1)."),
    pp: int | None = typer.Option(
        None, callback=opt.positive_int, help="Pipeline parallel stages (default: 1)."),
    ep: int | None = typer.Option(
        None, callback=opt.positive_int, help="Expert parallel degree within tp (default: 1)."),
    replicas: int | None = typer.Option(
        None, callback=opt.positive_int, help="Data-parallel replicas (default: 1)."),
    microbatches: int | None = typer.Option(
        None, callback=opt.positive_int, help="Pipeline micro-batches (default: pp)."),
    attention_dp: int | None = typer.Option(
        None, callback=opt.positive_int, help="Attention data-parallel ranks within tp (MoE: "
        "each rank holds its 1/N of the sequences' attention and KV, the experts run ep = tp; "
        "default: 1)."),
    dispatch_dtype: str | None = typer.Option(
        None, callback=opt.one_of(DISPATCH_DTYPES),
        help=f"MoE all-to-all dispatch: {opt.choices(DISPATCH_DTYPES)} (default: model)."),
    dense_dp: bool = typer.Option(
        False, "--dense-dp", help="With --attention-dp: the dense MLP layers run on each "
        "rank's own tokens (SGLang's --moe-dense-tp-size 1), no gather over all tp devices."),
    overlap: str | None = typer.Option(
        None, callback=opt.one_of(OVERLAP_CHOICES), help=OVERLAP_HELP),
    kv_bits: int | None = typer.Option(None, callback=opt.positive_int, help=KV_BITS_HELP),
    mem_util: float | None = typer.Option(None, callback=check_mem_util, help=MEM_UTIL_HELP),
    workspace_tokens: int | None = typer.Option(
        None, callback=opt.non_negative_int, help=WORKSPACE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    ops: bool = typer.Option(False, "--ops", help="Also print the per-operator table."),
    diffusion_steps: str | None = typer.Option(
        None, callback=opt.positive_int_list, help="Masked-diffusion decoding (LLaDA): "
        "price L = --gen tokens in S refinement steps, e.g. 16,64; see docs/diffusion.md."),
    block_length: int | None = typer.Option(
        None, callback=opt.positive_int, help="Diffusion block length B (default --gen)."),
    prefix_cache: bool = typer.Option(
        False, "--prefix-cache", help="Diffusion: block-wise prefix K/V cache (Fast-dLLM)."),
    efficiency: str | None = typer.Option(None, callback=opt.non_empty, help=EFFICIENCY_HELP),
) -> None:
    """Predict TTFT, time per token, throughput, memory and max batch from the roofline."""
    if diffusion_steps is not None:
        from infbench.commands.predict_diffusion import run_predict_diffusion

        others = {"scenario": scenario, "set": set_, "spec-tokens": spec_tokens, "tp": tp,
                  "pp": pp, "quant": quant, "activations": activations,
                  "fp8-scales": fp8_scales, "attention": attention, "efficiency": efficiency}
        used = [k for k, v in others.items() if v not in (None, [], ())]
        if used:
            raise UserError(f"--diffusion-steps: --{used[0]} is not modelled for diffusion "
                            "decoding; allowed with it: --model, --hardware, --batch, --prompt, "
                            "--gen, --dtype, --block-length, --prefix-cache, --json")
        source = opt.model_source(model or DEFAULT_MODEL)
        run_predict_diffusion(source, hardware or DEFAULT_HARDWARE,
                              parse_sizes(batch or "1", "--batch"), prompt or 128, gen or 256,
                              parse_sizes(diffusion_steps, "--diffusion-steps"), block_length,
                              prefix_cache, dtype or "bfloat16", as_json)
        return
    if block_length is not None or prefix_cache:
        raise UserError("--block-length and --prefix-cache need --diffusion-steps")
    reserve = memory_reserve(mem_util, workspace_tokens)
    derating = _derating(efficiency)
    model_flags = dict(kv_heads=kv_heads, window=window, global_every=global_every,
                       cla_group=cla_group, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank,
                       feature_map=feature_map, feature_dim=feature_dim, d_state=d_state,
                       attn_every=attn_every)
    if scenario is not None:
        flags = {"model": model, "hardware": hardware, "batch": batch, "prompt": prompt,
                 "gen": gen, "dtype": dtype, "attention": attention, "quant": quant,
                 "activations": activations, "fp8-scales": fp8_scales, "kv-dtype": kv_dtype,
                 "set": set_, "spec-tokens": spec_tokens,
                 "tp": tp, "pp": pp, "ep": ep, "replicas": replicas,
                 "microbatches": microbatches, "attention_dp": attention_dp,
                 "dispatch_dtype": dispatch_dtype, "dense_dp": dense_dp or None,
                 **model_flags}
        used = [k.replace("_", "-") for k, v in flags.items() if v not in (None, [], ())]
        if used:
            raise UserError(f"{scenario}: the scenario defines the points; drop --{used[0]}")
        _predict_scenario(scenario, PricingOptions(None, overlap or "auto", reserve, kv_bits,
                                                   derating[0]), as_json, ops, derating[1])
        return
    source = opt.model_source(model or DEFAULT_MODEL)
    prompt_len, gen_len, note = default_lengths(config_from_source(source), prompt, gen)
    if window is not None and window > prompt_len + gen_len:
        raise UserError(f"--window {window} is larger than the context "
                        f"(--prompt + --gen = {prompt_len + gen_len})")
    from infbench.hardware.spec import get_hardware

    hw = get_hardware(hardware or DEFAULT_HARDWARE)  # unknown: the table's allowed list
    # the flags price one batch (static waves): the roofline; a scenario is also simulated
    options = PricingOptions(build_spec(spec_tokens, spec_acceptance, spec_draft_ratio),
                             overlap or "auto", reserve, kv_bits, derating[0], simulate=False)
    if options.efficiency is not None:
        from infbench.measure.prediction import derate

        hw = derate(hw, options.efficiency)
    sizes = parse_sizes(batch or "1", "--batch")
    if not set_:
        # Flags only: each was checked against the same allowed values as the scenario
        # schema (commands/_options.py), so the schema (pydantic, ~150 ms) is not loaded.
        # One batch of each size at once: a point of as many requests as its batch.
        from infbench.roofline.analysis import check_context

        cfg = config_from_source(source)
        values = attention_values(cfg, attention, model_flags)
        cfg = cfg.with_overrides(attention=values) if values else cfg
        qcfg = build_quant(quant, group_size, kv_dtype, source, kv_bits, activations,
                           fp8_scales)
        par = parallel_config(tp, pp, ep, replicas, microbatches, attention_dp, dispatch_dtype,
                              dense_dp)
        check_context(cfg, prompt_len, gen_len)
        prices = [price(cfg, hw, PricedWorkload(b, b, prompt_len, gen_len, dtype or "bfloat16",
                                                qcfg, options.speculative, par),
                        overlap=options.overlap, reserve=options.reserve) for b in sizes]
        if note:
            print(note, file=sys.stderr)
        _emit(prices, [""] * len(prices), [source] * len(prices), as_json, ops, derating[1])
        return
    doc = model_document(
        "predict", model or DEFAULT_MODEL, set_, hardware=hardware or DEFAULT_HARDWARE,
        dtype=dtype or "bfloat16",
        quant={"weights": quant, "group_size": group_size, "kv": kv_dtype,
               "activations": activations, "fp8_scales": fp8_scales},
        workload={"batch_size": _one_or_list(sizes), "prompt_len": prompt_len,
                  "gen_len": gen_len},
        parallel=parallel_flags(tp, pp, ep, replicas, microbatches, attention_dp,
                                dispatch_dtype, dense_dp),
        # --batch is the batch at once, as without --set: no engine cap unless --set sets one
        engine={"max_num_seqs": MAX_BATCH})
    points = apply_attention_flags(doc, attention, model_flags)
    prices = price_points(points, options)
    if note:
        print(note, file=sys.stderr)
    swept = any(item.startswith("sweep.") for item in set_)
    _emit(prices, [point.label if swept else "" for point in points],
          [point.model_source() for point in points], as_json, ops, derating[1])


def _derating(text: str | None) -> tuple[Any, dict[str, Any] | None]:
    """--efficiency -> (Efficiency or None, what the output says about it)."""
    if text is None:
        return None, None
    from infbench.measure.efficiency import parse_efficiency

    eff, fit = parse_efficiency(text)
    info: dict[str, Any] = {"bandwidth": eff.bandwidth, "compute": eff.compute,
                            "source": eff.label}
    if fit is None:
        info["summary"] = (f"efficiency: {eff.bandwidth:.0%} of the bandwidth and compute "
                           "peaks (given)")
    else:
        info.update(summary=fit.summary(), rows=list(fit.rows),
                    bandwidth_determined=fit.bandwidth_determined,
                    compute_determined=fit.compute_determined,
                    leave_one_out_errors=dict(zip(fit.rows, fit.loo_errors, strict=True)))
    return eff, info


def _predict_scenario(path: Path, options: PricingOptions, as_json: bool, ops: bool,
                      efficiency: dict[str, Any] | None = None) -> None:
    """`infbench predict SCENARIO`: each point priced as `run` records its prediction."""
    from infbench.scenario.schema import load_scenario

    points = load_scenario(path).points()
    if any(p.decoding is not None for p in points):
        raise UserError(f"{path}: decoding.kind diffusion points are priced by "
                        "`infbench predict --diffusion-steps` (and next to `run`'s "
                        "measurements), not by predict SCENARIO")
    prices = price_points(points, options)
    _emit(prices, [point.label for point in points],
          [point.model_source() for point in points], as_json, ops, efficiency)
    if not as_json:
        from infbench.commands.predict_load import print_under_load

        print_under_load(points, prices)


def _emit(prices: list[PointPrice], labels: list[str], models: list[dict[str, str]],
          as_json: bool, ops: bool, efficiency: dict[str, Any] | None = None) -> None:
    """Print the table or the JSON rows, naming where each model's shapes came from (and
    the --efficiency derating, when given)."""
    for model_dict in {json.dumps(m, sort_keys=True): m for m in models}.values():
        note_source(model_dict)
    if not as_json:
        print_predictions(prices, ops, labels)
        if efficiency is not None:
            print(efficiency["summary"])
        return
    from infbench.roofline.analysis import deployment_dict

    rows = []
    for pp, label, model in zip(prices, labels, models, strict=True):
        row = pp.to_dict()  # the keys and values `run` records as the result's prediction
        if pp.prediction is not None:
            row.update(deployment_dict(pp.prediction))
        row["model_source"] = source_label(model)
        if label:  # scenario points carry their sweep label
            row["point"] = label
        if efficiency is not None:
            row["efficiency"] = efficiency
        rows.append(row)
    emit_json(rows)
