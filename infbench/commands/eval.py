"""`infbench eval`: perplexity and greedy agreement of a (quantized) model (parse, call, print).

The measurement lives in `infbench.measure.accuracy`; torch is imported only when the
command runs, so `infbench --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from infbench.checkpoint.metadata import model_source
from infbench.commands import _options as opt
from infbench.core.config import ACTIVATION_QUANT, HEAD_QUANT, INT4_GROUP_SIZES, QUANT_METHODS
from infbench.core.errors import UserError


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)


def eval_command(
    model: str = typer.Option(..., "--model", callback=opt.non_empty,
                              help=f"{opt.MODEL_HELP} It needs a tokenizer (smollm2-135m, a "
                                   "GGUF file, an HF directory with tokenizer.json)."),
    dtype: str = typer.Option("float32", "--dtype", callback=opt.dtype_or_auto,
                              help=f"auto | {opt.choices(opt.DTYPES)}; the reference runs in "
                                   "the same dtype."),
    quant: str = typer.Option("none", "--quant", callback=opt.weight_quant,
                              help=f"Weight quantization: {opt.choices(opt.WEIGHT_QUANT)}."),
    group_size: int | None = typer.Option(
        None, "--group-size", callback=opt.positive_int,
        help="int4 group size (32 | 64 | 128; default: the largest that divides every "
             "projection's input width, 64 for SmolLM2's 576); int8 keeps one scale per "
             "output channel."),
    method: str = typer.Option("rtn", "--method", callback=opt.one_of(QUANT_METHODS),
                               help=opt.choices(QUANT_METHODS)),
    head: str = typer.Option("model", "--head", callback=opt.one_of(HEAD_QUANT),
                             help="The LM head: model (the model dtype) | int8 (per-row "
                                  "scales)."),
    activations: str = typer.Option("float", "--activations",
                                    callback=opt.one_of(ACTIVATION_QUANT),
                                    help="What quantized projections multiply: float | int8 "
                                         "(32-column blocks rounded to int8, llama.cpp's "
                                         "arithmetic)."),
    kv: str = typer.Option("none", "--kv", callback=opt.kv_quant,
                           help=f"KV-cache quantization: {opt.choices(opt.KV_QUANT)}."),
    tokens: int = typer.Option(2048, "--tokens", callback=opt.positive_int,
                               help="Tokens of the test split scored for perplexity (>= 2)."),
    window: int = typer.Option(512, "--window", callback=opt.positive_int,
                               help="Tokens per perplexity window (>= 2)."),
    prompts: int = typer.Option(8, "--prompts", callback=opt.positive_int,
                                help="Greedy-agreement prompts (64 tokens each, test split)."),
    new_tokens: int = typer.Option(32, "--new-tokens", callback=opt.positive_int,
                                   help="Greedy tokens compared per prompt."),
    device: str = typer.Option("cpu", "--device", callback=opt.device,
                               help=opt.choices(opt.DEVICES)),
    backend: str = typer.Option("auto", "--backend", callback=opt.backend,
                                help=f"{opt.choices(opt.BACKENDS)}: the engine's kernels both "
                                     "models run on."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    out: Path | None = typer.Option(None, "--out", callback=opt.output_file,
                                    help="Also write the JSON object to this file."),
) -> None:
    """Perplexity and greedy agreement of a (quantized) model against its unquantized self.

    Perplexity on held-out Python documentation text and greedy agreement with the
    unquantized model of the same dtype (see docs/accuracy.md)."""
    from rich.console import Console

    from infbench.core.config import QuantConfig
    from infbench.core.device import auto_dtype, resolve_device
    from infbench.measure.accuracy import EvalPlan, compare, model_figures, use_backend
    from infbench.model.loader import load_model

    console = Console(stderr=True, soft_wrap=True)
    source = model_source(model)
    plan = EvalPlan(tokens=tokens, window=window, num_prompts=prompts, new_tokens=new_tokens)
    if out is not None:  # before the minutes of measuring, not after them
        from infbench.core.io import check_output_file

        for stale in check_output_file(out):
            opt.note(f"note: removed {stale}: the unfinished output of an interrupted run")
    if group_size is None:
        group_size = 128
        if quant == "int4":
            from infbench.checkpoint.metadata import config_from_source

            group_size, widths = default_group_size(config_from_source(source))
            opt.note(f"note: --group-size not given: int4 groups of {group_size}, the largest "
                     f"of {', '.join(map(str, INT4_GROUP_SIZES))} that divides every "
                     f"projection's input width ({', '.join(map(str, widths))})")
    dev = resolve_device(device, "--device")
    if dtype == "auto":
        dtype, why = auto_dtype(dev)
        console.print(f"note: dtype auto -> {dtype} ({why})", highlight=False)
    qc = QuantConfig(weights=quant, group_size=group_size, kv=kv, method=method, head=head,
                     activations=activations)
    is_quantized = quant != "none" or kv != "none" or head != "model"
    candidate = load_model(source, dtype=dtype, device=dev, quant=qc if is_quantized else None)
    console.print(f"note: {model}: {candidate.source}; weights {candidate.weights}",
                  highlight=False)
    backend = use_backend(candidate, backend)
    figures = model_figures(candidate, plan, with_continuations=is_quantized, kv=kv)
    candidate_bytes = candidate.weight_bytes
    reference_figures = reference_bytes = None
    if is_quantized:
        del candidate  # one model resident at a time
        reference = load_model(source, dtype=dtype, device=dev)
        use_backend(reference, backend)
        reference_bytes = reference.weight_bytes
        reference_figures = model_figures(reference, plan, with_continuations=True)
    result = compare(figures, reference_figures, plan)
    doc: dict[str, Any] = {
        "model": model, "dtype": dtype, "device": dev, "backend": backend,
        "quant": {"weights": quant, "group_size": group_size, "method": method, "kv": kv,
                  "head": head, "activations": activations},
        **result.to_dict(),
        "weight_bytes": candidate_bytes,
        "reference_weight_bytes": reference_bytes if is_quantized else candidate_bytes,
        "reference": f"{model} {dtype} unquantized" if is_quantized else "the model itself",
    }
    if not is_quantized:  # the model is its own reference: identical by definition
        doc.update(reference_perplexity=result.perplexity, perplexity_change=0.0,
                   greedy_agreement=1.0)
    text = json.dumps(doc, indent=2)
    if out is not None:
        from infbench.core.io import write_text_atomic

        write_text_atomic(out, text + "\n")
    if as_json:
        print(text)
    else:
        _print_table(doc)
    if out is not None:
        console.print(f"wrote {out}", highlight=False)


def default_group_size(cfg: Any) -> tuple[int, list[int]]:
    """`roofline.shapes.largest_int4_group`, or a UserError when no group divides them all."""
    from infbench.roofline.shapes import largest_int4_group

    group, widths = largest_int4_group(cfg)
    if group is None:
        raise UserError(f"--quant int4: no int4 group size "
                        f"({', '.join(map(str, INT4_GROUP_SIZES))}) divides every projection's "
                        f"input width of {cfg.name!r} ({', '.join(map(str, widths))}); use "
                        "--quant int8")
    return group, widths


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    q = doc["quant"]
    what = "unquantized" if q["weights"] == "none" and q["kv"] == "none" else (
        f"weights {q['weights']}"
        + (f" g{q['group_size']}" if q["weights"] == "int4" else "")
        + f" {q['method']}, kv {q['kv']}"
        + (f", head {q['head']}" if q.get("head", "model") != "model" else "")
        + (f", {q['activations']} activations" if q.get("activations", "float") != "float"
           else ""))
    table = Table(title=f"accuracy of {doc['model']} ({doc['dtype']}, {what})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    agreement = doc["greedy_agreement"]
    rows = [
        ("perplexity", f"{doc['perplexity']:.4f}"),
        ("reference perplexity", f"{doc['reference_perplexity']:.4f}"),
        ("perplexity change", f"{doc['perplexity_change'] * 100:+.2f}%"),
        (f"greedy agreement ({doc['agreement_prompts']} x {doc['agreement_tokens']} tokens)"
         if doc["agreement_prompts"] else "greedy agreement", f"{agreement:.3f}"),
        ("weight bytes stored", f"{doc['weight_bytes']:,}"),
        ("reference weight bytes", f"{doc['reference_weight_bytes']:,}"),
        ("tokens scored (window)", f"{doc['tokens']:,} ({doc['window']})"),
        ("text", doc["text_id"]),
        ("reference", doc["reference"]),
        ("seconds (measuring)", f"{doc['seconds']:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(file=sys.stdout).print(table)
