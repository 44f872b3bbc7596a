"""`infbench predict | kv | roofline | models | hardware`: the analytic model on the command line.

Everything here is parsing and printing; the numbers come from `infbench.roofline`.
No torch anywhere on these paths, so the commands start in a fraction of a second.
`--json` prints JSON (and only JSON) on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError

DEFAULT_MODEL = "llama2-13b"
DEFAULT_HARDWARE = "h100-sxm"
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


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """['attention.window=512', 'rope_theta=5e5'] -> nested overrides for ModelConfig."""
    overrides: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set expects field=value, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare word such as 'mla' or 'llama'
        target = overrides
        *parents, leaf = key.strip().split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise UserError(f"--set {item!r}: {parent} is not a group of fields")
        target[leaf] = value
    return overrides


def build_model(model: str, attention: str | None = None, sets: list[str] | None = None,
                **flags: Any) -> Any:
    """A preset with --set overrides and the attention flags applied (validated)."""
    from infbench.core.config import ModelConfig

    for name in ("kv_heads", "window", "global_every", "cla_group", "kv_lora_rank",
                 "q_lora_rank", "feature_dim", "d_state", "attn_every"):
        check_positive("--" + name.replace("_", "-"), flags.get(name))
    cfg = ModelConfig.from_name(model)
    overrides = parse_sets(sets)
    if overrides:
        cfg = cfg.with_overrides(**overrides)
    given = {k: v for k, v in flags.items() if v is not None}
    current = cfg.attention.kind
    kind = attention
    if kind is None:  # a flag only one kind reads switches a full-attention model to it
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
        return cfg
    values: dict[str, Any] = {"kind": kind, **given}
    if kind != current and kind in _KIND_FLAGS["kv_heads"]:
        values.setdefault("kv_heads", cfg.kv_heads)  # switching kinds keeps the KV heads
    return cfg.with_overrides(attention=values)


def build_quant(quant: str | None, group_size: int | None, kv_dtype: str | None) -> Any:
    from infbench.core.config import make_quant

    check_positive("--group-size", group_size)
    return make_quant({"weights": quant or "none", "group_size": group_size or 128,
                       "kv": kv_dtype or "none"})


def build_spec(tokens: int | None, acceptance: float | None, ratio: float | None) -> Any:
    from infbench.roofline.analysis import SpecConfig

    if tokens is None and acceptance is None and ratio is None:
        return None
    if tokens is None or acceptance is None:
        raise UserError("speculative decoding needs both --spec-tokens and --spec-acceptance")
    return SpecConfig(tokens, acceptance, ratio or 0.0)


def _spec_from_scenario(spec: Any) -> Any:
    from infbench.roofline.analysis import SpecConfig

    if spec is None or isinstance(spec, SpecConfig):
        return spec
    if (spec.get("method") if isinstance(spec, dict) else getattr(spec, "method", None)) == "none":
        return None

    def field(*names: str) -> Any:
        for name in names:
            value = spec.get(name) if isinstance(spec, dict) else getattr(spec, name, None)
            if value is not None:
                return value
        return None

    tokens = field("num_tokens", "num_speculative_tokens")
    acceptance = field("acceptance", "acceptance_rate")
    if tokens is None or acceptance is None:
        print("note: the scenario's speculative settings give no acceptance rate; "
              "predicting without speculation", file=sys.stderr)
        return None
    return SpecConfig(int(tokens), float(acceptance), float(field("draft_cost_ratio") or 0.0))


def _scenario_predictions(path: Path) -> tuple[list[Any], list[str]]:
    from infbench.core.hardware import get_hardware
    from infbench.core.scenario import load_scenario
    from infbench.roofline.analysis import predict

    predictions, labels = [], []
    for point in load_scenario(path).points():
        hw = get_hardware(point.hardware)
        dtype = point.dtype
        if dtype == "auto":  # the engine's choice: float32 on a CPU, bfloat16 on a GPU
            dtype = "float32" if hw.kind == "cpu" else "bfloat16"
        w = point.workload
        predictions.append(predict(
            point.model_config(), hw, batch=w.batch_size, prompt_len=w.prompt_len,
            gen_len=w.gen_len, dtype=dtype, quant=point.quant_config(),
            speculative=_spec_from_scenario(point.speculative),
        ))
        labels.append(str(getattr(point, "label", "") or ""))
    return predictions, labels


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def fmt_gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def fmt_si(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def make_console() -> Any:
    """A rich console at least 120 columns wide: tables stay readable when piped."""
    from rich.console import Console

    width = Console().width
    return Console(width=max(width, 120))


def print_predictions(predictions: list[Any], show_ops: bool,
                      labels: list[str] | None = None) -> None:
    from rich.table import Table

    console = make_console()
    table = Table(title="Roofline prediction (ms; GB; bound: prefill/decode)")
    show_labels = bool(labels and any(labels))
    if show_labels:
        table.add_column("point", overflow="fold", max_width=26)
    for col in ("model", "hardware", "batch", "prompt/gen", "memory", "max batch", "TTFT",
                "TPOT", "tok/s", "bound"):
        left = col in ("model", "hardware")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for i, p in enumerate(predictions):
        memory = fmt_gb(p.memory_bytes) if p.fits else f"[red]{fmt_gb(p.memory_bytes)}[/red]"
        table.add_row(
            *([labels[i]] if show_labels and labels else []),
            p.model, p.hardware, str(p.batch), f"{p.prompt_len}/{p.gen_len}", memory,
            str(p.max_batch), fmt_ms(p.ttft_s), fmt_ms(p.time_per_token_s),
            f"{p.tokens_per_s:,.0f}", f"{p.prefill.bound[0]}/{p.decode.bound[0]}",
        )
    console.print(table)
    for p in predictions:
        if not p.fits:
            console.print(f"[red]{p.model} b={p.batch} needs {fmt_gb(p.memory_bytes)} GB; "
                          f"{p.hardware} has {fmt_gb(p.memory_capacity_bytes)} GB[/red]")
        if p.speculative is not None:
            s = p.speculative
            console.print(
                f"{p.model} b={p.batch}: speculative g={s.config.num_tokens} "
                f"a={s.config.acceptance}: {s.expected_tokens_per_step:.2f} tokens/step, "
                f"{fmt_ms(s.step_time_s)} ms/step, {s.speedup:.2f}x over plain decode"
            )
    if not show_ops:
        return
    for p in predictions:
        ops = Table(title=f"{p.model} on {p.hardware}, batch {p.batch}: per operator "
                          "(decode: mean step)")
        for col in ("stage", "op", "FLOPs", "bytes", "FLOP/B", "time (ms)", "bound"):
            ops.add_column(col, justify="left" if col in ("stage", "op") else "right")
        for stage in (p.prefill, p.decode):
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
        None, callback=opt.non_empty, help=f"Model preset (default: {DEFAULT_MODEL})."),
    hardware: str | None = typer.Option(
        None, callback=opt.non_empty, help=f"Hardware (default: {DEFAULT_HARDWARE})."),
    batch: str | None = typer.Option(
        None, callback=opt.positive_int_list, help="Batch sizes, comma-separated (default: 1)."),
    prompt: int | None = typer.Option(
        None, callback=opt.positive_int, help="Prompt tokens (default: 1024)."),
    gen: int | None = typer.Option(
        None, callback=opt.positive_int, help="Generated tokens (default: 128)."),
    dtype: str | None = typer.Option(
        None, callback=opt.non_empty, help="Model dtype (default: bfloat16)."),
    kv_heads: int | None = typer.Option(
        None, callback=opt.positive_int, help="KV heads (GQA; switches MHA to gqa)."),
    attention: str | None = typer.Option(
        None, callback=opt.non_empty, help="mha | gqa | mqa | mla | cla | sliding | linear | ssm"),
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
        None, callback=opt.non_empty, help="Linear: elu | relu | favor | taylor."),
    feature_dim: int | None = typer.Option(
        None, callback=opt.positive_int, help="Linear: feature dimension."),
    d_state: int | None = typer.Option(None, callback=opt.positive_int, help="SSM state size."),
    attn_every: int | None = typer.Option(
        None, callback=opt.positive_int, help="Linear/SSM: every Nth layer attends."),
    quant: str | None = typer.Option(
        None, callback=opt.non_empty, help="Weights: none | int8 | int4."),
    group_size: int | None = typer.Option(
        None, callback=opt.positive_int, help="int4 group size (default: 128)."),
    kv_dtype: str | None = typer.Option(
        None, callback=opt.non_empty, help="KV cache: none | int8 | fp8."),
    set_: list[str] | None = typer.Option(None, "--set", help="field=value model override "
                                          "(dotted for attention./moe.), repeatable."),
    spec_tokens: int | None = typer.Option(
        None, callback=opt.positive_int, help="Speculative: draft tokens g."),
    spec_acceptance: float | None = typer.Option(
        None, callback=opt.unit_interval, help="Speculative: acceptance rate."),
    spec_draft_ratio: float | None = typer.Option(
        None, callback=opt.non_negative_float,
        help="Speculative: draft/target step cost (default: 0, free drafts)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    ops: bool = typer.Option(False, "--ops", help="Also print the per-operator table."),
) -> None:
    """Predict TTFT, time per token, throughput, memory and max batch from the roofline."""
    from infbench.core.hardware import get_hardware
    from infbench.roofline.analysis import predict

    model_flags = dict(kv_heads=kv_heads, window=window, global_every=global_every,
                       cla_group=cla_group, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank,
                       feature_map=feature_map, feature_dim=feature_dim, d_state=d_state,
                       attn_every=attn_every)
    if scenario is not None:
        flags = {"model": model, "hardware": hardware, "batch": batch, "prompt": prompt,
                 "gen": gen, "dtype": dtype, "attention": attention, "quant": quant,
                 "kv-dtype": kv_dtype, "set": set_, "spec-tokens": spec_tokens,
                 **model_flags}
        used = [k.replace("_", "-") for k, v in flags.items() if v not in (None, [], ())]
        if used:
            raise UserError(f"{scenario}: the scenario defines the points; drop --{used[0]}")
        predictions, labels = _scenario_predictions(scenario)
    else:
        prompt_len = 1024 if prompt is None else prompt
        gen_len = 128 if gen is None else gen
        check_positive("--prompt", prompt_len)
        check_positive("--gen", gen_len)
        if window is not None and window > prompt_len + gen_len:
            raise UserError(f"--window {window} is larger than the context "
                            f"(--prompt + --gen = {prompt_len + gen_len})")
        cfg = build_model(model or DEFAULT_MODEL, attention, set_, **model_flags)
        hw = get_hardware(hardware or DEFAULT_HARDWARE)
        qcfg = build_quant(quant, group_size, kv_dtype)
        spec = build_spec(spec_tokens, spec_acceptance, spec_draft_ratio)
        predictions = [
            predict(cfg, hw, batch=b, prompt_len=prompt_len, gen_len=gen_len,
                    dtype=dtype or "bfloat16", quant=qcfg, speculative=spec)
            for b in parse_sizes(batch or "1", "--batch")
        ]
        labels = [""] * len(predictions)
    if as_json:
        rows = [p.to_dict() for p in predictions]
        for row, label in zip(rows, labels, strict=True):  # scenario points carry their sweep label
            if label:
                row["point"] = label
        emit_json(rows)
    else:
        print_predictions(predictions, ops, labels)
