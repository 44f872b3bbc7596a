"""`infbench prune`: prune a model, optionally distill it, report perplexity, save it.

Layers go by Block Influence and MLP channels by activation magnitude on the
calibration split of the evaluation text (`model/prune.py`, the same pass as a
scenario's `model.prune`); `--distill-steps N` then runs N AdamW steps of logit
distillation against the unpruned model (`model/distill.py`).  Perplexity on the held-out
test split is measured before pruning, after it and after distillation, and the result is
written as a Hugging Face checkpoint directory (`model/hf_writer.py`) that `model: {path:
DIR}` runs.  Everything runs on the CPU in float32.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError


def register(app: typer.Typer) -> None:
    app.command("prune")(prune)


def _fraction(value: float | None) -> float | None:
    """--mlp-fraction: a finite number in [0, 1)."""
    if value is not None and not (math.isfinite(value) and 0 <= value < 1):
        raise typer.BadParameter(f"must be in [0, 1) (got {value})")
    return value


def prune(
    model: str = typer.Option(..., "--model", callback=opt.non_empty,
                              help=f"{opt.MODEL_HELP} It needs a tokenizer."),
    layers: int = typer.Option(0, "--layers", callback=opt.non_negative_int,
                               help="Whole decoder layers to drop (lowest Block Influence)."),
    mlp_fraction: float = typer.Option(0.0, "--mlp-fraction", callback=_fraction,
                                       help="Fraction of every MLP's channels to remove, in "
                                            "[0, 1) (smallest mean |silu(gate)*up| first)."),
    distill_steps: int = typer.Option(0, "--distill-steps", callback=opt.non_negative_int,
                                      help="AdamW steps of logit distillation against the "
                                           "unpruned model (0: none)."),
    lr: float = typer.Option(1e-4, "--lr", callback=opt.positive_finite,
                             help="Distillation learning rate."),
    calibration_tokens: int = typer.Option(1024, "--calibration-tokens",
                                           callback=opt.positive_int,
                                           help="Calibration tokens the importance scores are "
                                                "measured on (as model.prune)."),
    eval_tokens: int = typer.Option(4096, "--eval-tokens", callback=opt.positive_int,
                                    help="Test-split tokens perplexity is measured on."),
    threads: int | None = typer.Option(None, "--threads", callback=opt.positive_int,
                                       help="CPU threads (default: torch's, one per core)."),
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint to."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace a non-empty --out directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Prune layers and/or MLP width, optionally distill, report perplexity, save the model."""
    from infbench.checkpoint.metadata import config_from_source, model_source
    from infbench.core.config import PruneConfig
    from infbench.core.io import check_output_dir
    from infbench.model.hf_writer import check_writable

    source = model_source(model)
    cfg = config_from_source(source)
    if layers >= cfg.num_layers:
        raise UserError(f"--layers {layers}: model {model!r} has {cfg.num_layers} layers; "
                        f"allowed: 0..{cfg.num_layers - 1}")
    if eval_tokens < 2:
        raise UserError(f"--eval-tokens {eval_tokens}: perplexity needs at least 2 tokens")
    config = PruneConfig(layers=layers, mlp_fraction=mlp_fraction,
                         calibration_tokens=calibration_tokens)
    config.pruned_shape(cfg)  # refuses models whose layers cannot be dropped, before loading
    check_writable(cfg)
    # --out before any work: a path that cannot take the checkpoint is refused now, not
    # after the minutes of pruning and distillation; a killed run's temporary goes first
    for stale in check_output_dir(out, overwrite):
        opt.note(f"note: removed {stale}: the unfinished output of an interrupted run")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    report = run_prune(source, model, config, distill_steps, lr, eval_tokens, out, overwrite)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)


def run_prune(source: dict[str, str], model: str, config: Any, distill_steps: int, lr: float,
              eval_tokens: int, out: Path, overwrite: bool) -> dict[str, Any]:
    """The whole pipeline; returns the report (what `--json` prints)."""
    import copy

    import torch

    from infbench.model.distill import distill
    from infbench.model.eval_text import eval_text, text_id
    from infbench.model.evaluate import perplexity, token_ids
    from infbench.model.hf_writer import save_checkpoint
    from infbench.model.loader import load_model
    from infbench.model.prune import apply_prune

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    loaded = load_model(source, dtype="float32", device="cpu", weights="auto")
    if loaded.tokenizer is None:
        raise UserError(f"--model {model}: the model has no tokenizer; `infbench prune` "
                        "measures on text: use a GGUF file, an HF directory with "
                        "tokenizer.json, or smollm2-135m")
    seconds["load"] = time.perf_counter() - start
    test_ids = token_ids(loaded.tokenizer, "test", eval_tokens)

    def measure(stage: str) -> float:
        opt.note(f"perplexity of the {stage} model on {len(test_ids)} test tokens ...")
        begin = time.perf_counter()
        value = perplexity(loaded.model, test_ids)
        seconds[f"eval_{stage}"] = time.perf_counter() - begin
        return value

    rows: list[dict[str, Any]] = [_row("original", loaded, measure("original"))]
    teacher = copy.deepcopy(loaded.model) if distill_steps else None
    opt.note(f"pruning: layers {config.layers}, MLP fraction {config.mlp_fraction:g}, "
          f"{config.calibration_tokens} calibration tokens ...")
    begin = time.perf_counter()
    pruned = apply_prune(loaded, config)
    seconds["prune"] = time.perf_counter() - begin
    rows.append(_row("pruned", loaded, measure("pruned")))
    distilled: dict[str, Any] | None = None
    if teacher is not None:
        opt.note(f"distilling: {distill_steps} steps, lr {lr:g} ...")
        cal = loaded.tokenizer.encode(eval_text("calibration"), add_special_tokens=False)
        result = distill(loaded.model, teacher, cal, distill_steps, lr,
                         on_step=lambda i, loss: opt.note(f"  step {i + 1}/{distill_steps}: "
                                                       f"KL {loss:.4f}"))
        del teacher
        seconds["distill"] = result.seconds
        distilled = {"steps": result.steps, "lr": lr, "tokens_per_step": result.tokens_per_step,
                     "kl_first_batch_before": result.kl_before,
                     "kl_first_batch_after": result.kl_after, "losses": result.losses}
        rows.append(_row("distilled", loaded, measure("distilled")))
    begin = time.perf_counter()
    save_checkpoint(loaded, out, overwrite=overwrite)
    seconds["write"] = time.perf_counter() - begin
    seconds["total"] = time.perf_counter() - start
    base = rows[0]["perplexity"]
    for row in rows:
        row["perplexity_change"] = row["perplexity"] / base - 1
    return {
        "model": model,
        "out": str(out),
        "prune": {"layers": config.layers, "mlp_fraction": config.mlp_fraction,
                  "calibration_tokens": pruned.calibration_tokens,
                  "dropped_layers": pruned.dropped_layers,
                  "layer_scores": pruned.layer_scores,
                  "mlp_width": list(pruned.mlp_width)},
        "distill": distilled,
        "eval": {"text": text_id("test"), "tokens": len(test_ids), "window": 512},
        "perplexity": {row["stage"]: row["perplexity"] for row in rows},
        "stages": rows,
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
    }


def _row(stage: str, loaded: Any, ppl: float) -> dict[str, Any]:
    cfg = loaded.config
    params = sum(p.numel() for p in loaded.model.parameters())
    return {"stage": stage, "num_layers": cfg.num_layers,
            "intermediate_size": cfg.intermediate_size, "parameters": params,
            "weight_bytes": loaded.weight_bytes, "perplexity": ppl}


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    prune = report["prune"]
    table = Table(title=f"infbench prune {report['model']}: perplexity on "
                        f"{report['eval']['tokens']} tokens of {report['eval']['text']}")
    for column in ("stage", "layers", "MLP width", "parameters", "weights", "perplexity",
                   "change"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for row in report["stages"]:
        table.add_row(row["stage"], str(row["num_layers"]), str(row["intermediate_size"]),
                      f"{row['parameters'] / 1e6:.1f}M", f"{row['weight_bytes'] / 1e6:.0f} MB",
                      f"{row['perplexity']:.3f}", f"{row['perplexity_change']:+.1%}")
    console = Console()
    console.print(table)
    if prune["dropped_layers"]:
        console.print(f"dropped layers (Block Influence, lowest first): {prune['dropped_layers']}")
    if report["distill"] is not None:
        d = report["distill"]
        console.print(f"distillation: {d['steps']} steps x {d['tokens_per_step']} tokens, lr "
                      f"{d['lr']:g}; KL on the first batch {d['kl_first_batch_before']:.4f} -> "
                      f"{d['kl_first_batch_after']:.4f}")
    secs = report["seconds"]
    evals = sum(v for k, v in secs.items() if k.startswith("eval_"))
    steps = [f"load {secs['load']:.1f}", f"prune {secs['prune']:.1f}"]
    if "distill" in secs:
        steps.append(f"distill {secs['distill']:.1f}")
    steps += [f"perplexity {evals:.1f}", f"write {secs['write']:.1f}", f"total {secs['total']:.1f}"]
    console.print(f"seconds ({report['torch_threads']} threads): {', '.join(steps)}")
    console.print(f"wrote {report['out']}; run it with `model: {{path: {report['out']}}}`")
