"""`infbench train-draft`: train Medusa or EAGLE draft heads for a model, save them.

The heads learn from text the model writes itself (`model/draft_train.py`): greedy
continuations of prompts from the calibration split, the model's hidden states on them,
then `--steps` AdamW steps.  The report gives the held-out loss before and after and the
held-out top-1 accuracy of the first draft; the heads go to one safetensors file that a
scenario's `speculative: {method: medusa|eagle, heads: FILE}` runs.  Everything runs in
float32 on the CPU.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import typer

from infbench.commands import _options as opt
from infbench.core.errors import UserError
from infbench.core.speculative import HEAD_METHODS

DEFAULT_HEADS = 4
DEFAULT_SEQUENCES = 56  # DraftTrainConfig's defaults (not imported: torch)
HELDOUT = 8
OUT_DIR = Path("results") / "draft-heads"


def register(app: typer.Typer) -> None:
    app.command("train-draft")(train_draft)


def default_out(method: str, model_name: str) -> Path:
    """results/draft-heads/<method>-<model-name>.safetensors, the name made file-safe."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
    return OUT_DIR / f"{method}-{safe}.safetensors"


def train_draft(
    method: str = typer.Option(..., "--method", callback=opt.one_of(HEAD_METHODS),
                               help=f"Draft heads to train: {opt.choices(HEAD_METHODS)}."),
    model: str = typer.Option(..., "--model", callback=opt.non_empty,
                              help=f"{opt.MODEL_HELP} It needs a tokenizer."),
    steps: int = typer.Option(..., "--steps", callback=opt.positive_int,
                              help="AdamW steps."),
    num_heads: int | None = typer.Option(None, "--num-heads", callback=opt.positive_int,
                                         help=f"Medusa heads K, one per draft position "
                                              f"(default {DEFAULT_HEADS}; medusa only)."),
    out: Path | None = typer.Option(None, "--out", callback=opt.output_file,
                                    help="File to write (replaced if it exists; default "
                                         "results/draft-heads/<method>-<model>.safetensors)."),
    seed: int = typer.Option(0, "--seed", callback=opt.seed, help="Seed of the initial "
                                                                  "weights and the batches."),
    lr: float | None = typer.Option(None, "--lr", callback=opt.positive_finite,
                                    help="Peak learning rate (default 1e-3)."),
    sequences: int = typer.Option(DEFAULT_SEQUENCES, "--sequences", callback=opt.positive_int,
                                  help=f"Prompts the model continues for its training text, "
                                       f"{HELDOUT} of them held out (64 training positions "
                                       f"each); more than {HELDOUT}."),
    threads: int | None = typer.Option(None, "--threads", callback=opt.positive_int,
                                       help="CPU threads (default: torch's, one per core)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Train Medusa or EAGLE draft heads on the model's own greedy text; save them."""
    from infbench.checkpoint.metadata import config_from_source, model_source
    from infbench.core.io import check_output_file

    if num_heads is not None and method != "medusa":
        raise UserError(f"--num-heads: only --method medusa has several heads (got --method "
                        f"{method})")
    if sequences <= HELDOUT:
        raise UserError(f"--sequences {sequences}: {HELDOUT} sequences are held out; allowed: "
                        f"{HELDOUT + 1} or more")
    source = model_source(model)
    # The file is checked before any work (training takes minutes): a preset by its name
    # (smollm2-135m), a file or directory by its config's name, as the loader names it.
    path = out if out is not None else default_out(
        method, source.get("preset") or config_from_source(source).name)
    for stale in check_output_file(path):
        opt.note(f"note: removed {stale}: the unfinished output of an interrupted run")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    report = run_train_draft(source, model, method, steps, num_heads or DEFAULT_HEADS, seed,
                             lr, path, sequences)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)


def run_train_draft(source: dict[str, str], model: str, method: str, steps: int,
                    num_heads: int, seed: int, lr: float | None, out: Path | None,
                    sequences: int = DEFAULT_SEQUENCES) -> dict[str, Any]:
    """Load, train, save; returns the report (what `--json` prints)."""
    import torch

    from infbench.model import loader
    from infbench.model.draft_train import DraftTrainConfig, save_draft_heads, train_draft_heads
    from infbench.model.eval_text import text_id

    config = DraftTrainConfig(method=method, steps=steps, num_heads=num_heads, lr=lr, seed=seed,
                              num_sequences=sequences, heldout_sequences=HELDOUT)
    start = time.perf_counter()
    opt.note(f"loading {model} ...")
    loaded = loader.load_model(source, dtype="float32", device="cpu", weights="auto")
    if loaded.tokenizer is None:
        raise UserError(f"--model {model}: the model has no tokenizer; `infbench train-draft` "
                        "trains on text: use a GGUF file, an HF directory with tokenizer.json, "
                        "or smollm2-135m")
    load_s = time.perf_counter() - start
    every = max(1, steps // 10)

    def on_step(step: int, loss: float) -> None:
        if (step + 1) % every == 0 or step == 0:
            opt.note(f"  step {step + 1}/{steps}: loss {loss:.4f}")

    trained = train_draft_heads(loaded.model, loaded.tokenizer, config, opt.note, on_step)
    # A preset by its name (smollm2-135m), a file or directory by its config's name.
    name = source.get("preset") or loaded.config.name
    path = out if out is not None else default_out(method, name)
    save_draft_heads(path, trained.heads, loaded.model, trained.report)
    report = trained.report.to_dict()
    report["seconds"] = {"load": load_s, **report["seconds"],
                         "total": time.perf_counter() - start}  # load to the file written
    return {"model": model, "model_name": loaded.config.name, "weights": loaded.weights,
            "out": str(path), "num_heads": num_heads if method == "medusa" else None,
            "parameters": sum(p.numel() for p in trained.heads.parameters()),
            "data": {"text": text_id("calibration"), "sequences": config.num_sequences,
                     "heldout_sequences": config.heldout_sequences,
                     "prompt_tokens": config.prompt_tokens, "new_tokens": config.new_tokens},
            **report, "torch_threads": torch.get_num_threads()}


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"infbench train-draft --method {report['method']} "
                        f"--model {report['model']}: held-out figures")
    for column in ("", "loss", "draft-1 top-1"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("before training", f"{report['initial_loss']:.4f}",
                  f"{report['head1_accuracy_before']:.1%}")
    table.add_row(f"after {report['steps']} steps", f"{report['final_loss']:.4f}",
                  f"{report['head1_accuracy']:.1%}")
    console = Console()
    console.print(table)
    if report["method"] == "medusa":
        heads = ", ".join(f"{i + 1}: {a:.1%}" for i, a in enumerate(report["head_accuracy"]))
        console.print(f"top-1 by head (draft position): {heads}")
    secs = report["seconds"]
    console.print(f"{report['parameters'] / 1e6:.2f}M parameters; {report['train_positions']} "
                  f"training, {report['heldout_positions']} held-out positions; lr "
                  f"{report['lr']:g}; seconds ({report['torch_threads']} threads): load "
                  f"{secs['load']:.1f}, data {secs['data']:.1f}, train {secs['train']:.1f}, "
                  f"held-out {secs['eval']:.1f}, total {secs['total']:.1f}")
    console.print(f"wrote {report['out']}")
