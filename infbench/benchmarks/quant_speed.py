"""`make bench` (quantization): the engine's decode speed per weight format, one process.

SmolLM2-135M from its GGUF file (`SmolLM2-135M-Instruct.Q4_1.gguf`), CPU, `cpu` backend,
float32 activations unless a row says int8: every variant decodes the same random prompts
(`cpu_vs_transformers`'s: 128 tokens, 64 new tokens, greedy, EOS ignored) at batch 1 and
16, after one warm-up, for `--rounds` timed rounds (medians).  Variants, in the order they
run:

- float32: the file dequantized to float32 (the baseline of every ratio);
- int8: `quant.weights: int8` (one fp16 scale per output channel), LM head float32;
- int4 g64: `quant.weights: int4, group_size: 64` (RTN), LM head float32;
- int4 g64, head int8: the same with `quant.head: int8`;
- int8 / int4 g64 / int4 g64 head int8 with `quant.activations: int8`;
- Q4_1 native (float and int8 activations): the file's own blocks.

The speed targets read the float-activation rows with the model-dtype head (int8 >=
1.6x and int4 >= 2.5x float32 at batch 1; int4 above float32 at batch 16); the other rows
are printed beside them, with their ratios.

    python -m infbench.benchmarks.quant_speed [--rounds 3] [--prompt 128] [--gen 64]
        [--threads N] [--out results/bench_quant.json] [--quick]
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infbench.benchmarks.cpu_vs_transformers import (
    _median,
    infbench_round,
    load_average,
    load_note,
    random_prompts,
)

KIND = "infbench.bench.quant"
VERSION = 1
FULL: dict[str, Any] = {"rounds": 3, "prompt": 128, "gen": 64, "batches": (1, 16)}
QUICK: dict[str, Any] = {"rounds": 1, "prompt": 8, "gen": 6, "batches": (1, 2)}
FIELDS = {
    "rows[].decode_tokens_per_s": "decode tokens / the time of the steps that decoded them "
                                  "(median of rounds)",
    "rows[].vs_float32": "decode tokens/s / float32's at the same batch, same run",
    "rows[].weight_bytes": "bytes the model holds for its weights",
    "targets": "the speed targets: PASS or NOT MET",
}

# (name, model.quant of the variant); float32 first: every ratio is against it.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("float32", {}),
    ("int8", {"weights": "int8"}),
    ("int4 g64", {"weights": "int4", "group_size": 64}),
    ("int4 g64, head int8", {"weights": "int4", "group_size": 64, "head": "int8"}),
    ("int8, int8 act", {"weights": "int8", "activations": "int8"}),
    ("int4 g64, int8 act", {"weights": "int4", "group_size": 64, "activations": "int8"}),
    ("int4 g64, head int8, int8 act",
     {"weights": "int4", "group_size": 64, "head": "int8", "activations": "int8"}),
    ("Q4_1 native", {"weights": "native"}),
    ("Q4_1 native, int8 act", {"weights": "native", "activations": "int8"}),
]
BASELINE = VARIANTS[0][0]


@dataclass(frozen=True)
class Options:
    rounds: int
    prompt: int
    gen: int
    batches: tuple[int, ...]
    out: str
    quick: bool
    threads: int | None


def parse_args(argv: list[str] | None) -> Options:
    """The options; a bad value raises UserError naming it."""
    from infbench.benchmarks._main import round_options

    o = round_options(argv, __doc__, FULL, QUICK, "results/bench_quant.json",
                      "CPU threads (default: torch's, one per core)")
    return Options(rounds=o["rounds"], prompt=o["prompt"], gen=o["gen"],
                   batches=tuple(o["base"]["batches"]), out=o["out"], quick=o["quick"],
                   threads=o["threads"])


def _no_bytes(_step: Any) -> float:
    return 0.0  # rates only here (make bench's cpu_vs_transformers reports the MBU)


# A variant runner: (GGUF path, model.quant, prompts per batch, new tokens, rounds) ->
# {batch: row}; the tests substitute their own.
Runner = Callable[[Path, dict[str, Any], dict[int, list[list[int]]], int, int],
                  dict[int, dict[str, Any]]]


def engine_runner(path: Path, quant: dict[str, Any], prompts: dict[int, list[list[int]]],
                  gen: int, rounds: int) -> dict[int, dict[str, Any]]:
    """infbench's engine on the file with `quant`, at every batch of `prompts`."""
    from infbench.core.config import EngineConfig, QuantConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.model.loader import load_model

    loaded = load_model({"gguf": str(path)}, dtype="float32",
                        quant=QuantConfig(**quant) if quant else None)
    out: dict[int, dict[str, Any]] = {}
    for batch, batch_prompts in prompts.items():
        reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=gen, ignore_eos=True))
                for i, p in enumerate(batch_prompts)]
        cfg = EngineConfig(max_num_seqs=batch,
                           max_num_batched_tokens=max(2048, sum(len(p) for p in batch_prompts)))
        engine = Engine.create(loaded, cfg, "cpu", "float32",
                               sizing=KVSizing.for_requests(reqs, cfg.block_size))
        infbench_round(engine, reqs, _no_bytes, gen)  # warm-up
        timed = [infbench_round(engine, reqs, _no_bytes, gen) for _ in range(rounds)]
        out[batch] = {
            "backend": engine.ops.name, "weight_bytes": loaded.weight_bytes,
            "decode_tokens_per_s": _median([r["decode_tokens"] / r["decode_s"] for r in timed]),
            "rounds": [{k: r[k] for k in ("decode_s", "decode_tokens", "wall_s")}
                       for r in timed],
        }
        del engine
    del loaded
    gc.collect()
    return out


def _find(rows: Sequence[dict[str, Any]], variant: str, batch: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["variant"] == variant and r["batch"] == batch), None)


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 12's speed targets from the rows (ratios to float32 of the same run)."""
    batches = sorted({r["batch"] for r in rows})
    small, large = batches[0], batches[-1]
    specs = [(f"batch {small}: int8 / float32", "int8", small, 1.6),
             (f"batch {small}: int4 g64 / float32", "int4 g64", small, 2.5),
             (f"batch {large}: int4 g64 / float32", "int4 g64", large, 1.0)]
    out = []
    for label, variant, batch, needed in specs:
        row = _find(rows, variant, batch)
        if row is None or row.get("vs_float32") is None:
            out.append({"target": label, "needed": needed, "measured": None,
                        "status": "NOT RUN", "detail": f"needs the {variant} row"})
            continue
        ratio = row["vs_float32"]
        passed = ratio >= needed if needed != 1.0 else ratio > 1.0
        others = [f"{r['variant']} {r['vs_float32']:.2f}x" for r in rows
                  if r["batch"] == batch and r["variant"] != variant
                  and r["variant"].startswith(variant.split(" ")[0])
                  and r.get("vs_float32") is not None]
        out.append({"target": label, "needed": needed, "measured": ratio,
                    "status": "PASS" if passed else "NOT MET",
                    "detail": "; ".join([f"{row['decode_tokens_per_s']:.1f} tok/s", *others])})
    return out


def run(opts: Options, log: Callable[[str], None],
        variants: Sequence[tuple[str, dict[str, Any]]] | None = None,
        runner: Runner = engine_runner) -> dict[str, Any]:
    """Measure every variant; the result document (not yet written)."""
    from infbench.checkpoint.metadata import config_from_gguf, resolve_gguf
    from infbench.core.device import perf_flags
    from infbench.results.store import device_name, env_info

    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    threads = torch.get_num_threads()
    load_before = load_average()
    path = resolve_gguf("smollm2-135m")
    vocab = config_from_gguf(path).vocab_size
    prompts = {b: random_prompts(b, opts.prompt, vocab) for b in opts.batches}
    rows: list[dict[str, Any]] = []
    for name, quant in VARIANTS if variants is None else variants:
        log(f"{name}: batches {', '.join(map(str, opts.batches))}, warm-up + "
            f"{opts.rounds} rounds each")
        for batch, row in runner(path, quant, prompts, opts.gen, opts.rounds).items():
            rows.append({"variant": name, "quant": quant, "batch": batch, **row})
    for row in rows:
        base = _find(rows, BASELINE, row["batch"])
        row["vs_float32"] = (row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
                             if base is not None else None)
    return {
        "kind": KIND, "version": VERSION,
        "description": (__doc__ or "").split("\n\n")[0],
        "method": "one process; each variant: one warm-up, then args.rounds timed rounds "
                  "(medians) per batch on the same random prompts, greedy, EOS ignored",
        "fields": FIELDS,
        "note": "the machine may be shared: compare the ratios of one run",
        "env": env_info("cpu"),
        "cpu": {"model": device_name("cpu"), "perf_flags": perf_flags(), "threads": threads},
        "model": {"name": "SmolLM2-135M", "gguf": path.name},
        "args": {"rounds": opts.rounds, "prompt": opts.prompt, "gen": opts.gen,
                 "batches": list(opts.batches), "quick": opts.quick, "threads": opts.threads},
        "rows": rows, "targets": evaluate_targets(rows),
        "load_average": {"before": load_before, "after": load_average(),
                         "cores": os.cpu_count()},
    }


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render(data: dict[str, Any]) -> list[Any]:
    """The variants' table, the targets and the machine's load."""
    from rich.table import Table
    from rich.text import Text

    a, cpu = data["args"], data["cpu"]
    batches = a["batches"]
    table = Table(title=(f"SmolLM2-135M decode by weight format on {cpu['model']}, "
                         f"{cpu['threads']} thread{'s' if cpu['threads'] != 1 else ''}: "
                         f"{a['prompt']}-token prompts, {a['gen']} new tokens, median of "
                         f"{a['rounds']}"))
    table.add_column("variant", no_wrap=True)
    table.add_column("weight MB", justify="right")
    for b in batches:
        table.add_column(f"b={b} tok/s", justify="right")
        table.add_column(f"b={b} vs fp32", justify="right")
    names = list(dict.fromkeys(r["variant"] for r in data["rows"]))
    for name in names:
        cells: list[str] = []
        weight = None
        for b in batches:
            row = _find(data["rows"], name, b)
            if row is None:
                cells += ["-", "-"]
                continue
            weight = weight or row.get("weight_bytes")
            cells += [_fmt(row["decode_tokens_per_s"]), _fmt(row["vs_float32"], ".2f", "x")]
        table.add_row(name, _fmt(weight and weight / 1e6), *cells)
    out: list[Any] = [table]
    for t in data["targets"]:
        measured = "" if t["measured"] is None else f" {t['measured']:.2f}x,"
        need = (f">= {t['needed']:.2f}x" if t["needed"] != 1.0 else "> 1.00x")
        out.append(Text(f"target, {t['target']}:{measured} needed {need}: {t['status']} "
                        f"({t['detail']})"))
    out.append(Text(load_note(data["load_average"])))
    return out


def main(argv: list[str] | None = None) -> int:
    from infbench.benchmarks._main import bench_main

    return bench_main(argv, parse_args, run, render, min_width=120)


if __name__ == "__main__":
    sys.exit(main())
