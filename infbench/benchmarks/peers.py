"""`make bench-peers`: infbench beside llama.cpp on the SmolLM2-135M GGUF file, CPU, batch 1.

One process.  Every engine decodes the same random prompt (`cpu_vs_transformers`'s
batch-1 prompt: 128 tokens, 64 new tokens, greedy, EOS ignored) from the same file,
`SmolLM2-135M-Instruct.Q4_1.gguf`, after one warm-up, for `--rounds` timed rounds
(medians):

- infbench Q4_1 native, int8 act: `model.quant.weights: native`, the file's Q4_1 blocks as
  stored (`core/gguf_types.py`), with `quant.activations: int8` (activations rounded to
  int8 per 32 columns and multiplied with integer dot products, the arithmetic llama.cpp
  uses for Q4_1), the engine's `cpu` backend;
- infbench Q4_1 native: the same with float32 activations (the exact product);
- infbench float32: the same weights dequantized to float32 (what `make bench` runs);
- llama.cpp: `llama-cpp-python` on the file as shipped (Q4_1), as many threads as torch
  uses, measured by `cpu_vs_transformers.measure_llama_cpp`.

llama-cpp-python is a peer, not a dependency: building it from source takes about 25
minutes on 2 cores, so `make setup` does not install it.  When it is not importable its
row is skipped with a note and the target reads NOT RUN; the infbench rows are measured
anyway.  The target (Q4_1 native decode at least as fast as llama.cpp on the
same file and machine) is evaluated on the int8-activation row, like for like.

    python -m infbench.benchmarks.peers [--rounds 3] [--prompt 128] [--gen 64]
        [--threads N] [--out results/bench_peers.json] [--quick]
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
    measure_llama_cpp,
    random_prompts,
)

KIND = "infbench.bench.peers"
VERSION = 1
FULL: dict[str, Any] = {"rounds": 3, "prompt": 128, "gen": 64}
QUICK: dict[str, Any] = {"rounds": 1, "prompt": 8, "gen": 6}
NOT_INSTALLED = ("llama-cpp-python is not installed (a peer to compare with, not a "
                 "dependency; building it takes 8-25 minutes on 2 cores: "
                 "pip install llama-cpp-python): no llama.cpp row")
FIELDS = {
    "rows[].decode_tokens_per_s": "tokens after the first / the time that produced them "
                                  "(median of rounds)",
    "rows[].prefill_tokens_per_s": "prompt tokens / time to the first token (median)",
    "rows[].e2e_tokens_per_s": "new tokens / wall time of the whole generation (median)",
    "rows[].weights": "how the engine holds the GGUF's weights",
    "skipped": "engines not measured, with the reason",
    "target": "infbench Q4_1 native decode / llama.cpp decode >= 1: PASS, NOT MET, "
              "or NOT RUN (a row missing)",
}


@dataclass(frozen=True)
class Options:
    rounds: int
    prompt: int
    gen: int
    out: str
    quick: bool
    threads: int | None


def parse_args(argv: list[str] | None) -> Options:
    """The options; a bad value raises UserError naming it."""
    from infbench.benchmarks._main import round_options

    o = round_options(argv, __doc__, FULL, QUICK, "results/bench_peers.json",
                      "CPU threads of every engine (default: torch's, one per core)")
    return Options(rounds=o["rounds"], prompt=o["prompt"], gen=o["gen"], out=o["out"],
                   quick=o["quick"], threads=o["threads"])


# ---------------------------------------------------------------------- runners
# A runner measures one engine: (GGUF path, prompt ids, new tokens, rounds, threads) ->
# a row of rates, or None when the engine is not available here.
Runner = Callable[[Path, list[int], int, int, int], dict[str, Any] | None]


def _no_bytes(_step: Any) -> float:
    return 0.0  # this table reports rates only (make bench reports the MBU)


def infbench_runner(quant: str, activations: str = "float") -> Runner:
    """infbench's engine on the file at batch 1: `quant` native (Q4_1 as stored) or none
    (dequantized to float32); `activations` int8 rounds the quantized projections' inputs to
    int8 blocks (`quant.activations`)."""

    def run(path: Path, prompt: list[int], gen: int, rounds: int, threads: int) -> dict[str, Any]:
        from infbench.core.config import EngineConfig, QuantConfig
        from infbench.engine.engine import Engine, KVSizing
        from infbench.engine.request import Request, SamplingParams
        from infbench.model.loader import load_model

        loaded = load_model({"gguf": str(path)}, dtype="float32",
                            quant=QuantConfig(weights=quant, activations=activations))
        reqs = [Request("r0", tuple(prompt), SamplingParams(max_tokens=gen, ignore_eos=True))]
        cfg = EngineConfig(max_num_seqs=1, max_num_batched_tokens=max(2048, len(prompt)))
        engine = Engine.create(loaded, cfg, "cpu", "float32",
                               sizing=KVSizing.for_requests(reqs, cfg.block_size))
        infbench_round(engine, reqs, _no_bytes, gen)  # warm-up
        timed = [infbench_round(engine, reqs, _no_bytes, gen) for _ in range(rounds)]
        ttft = _median([r["ttft_s"] for r in timed])
        row = {
            "backend": engine.ops.name, "weight_bytes": loaded.weight_bytes, "ttft_s": ttft,
            "prefill_tokens_per_s": len(prompt) / ttft,
            "decode_tokens_per_s": (gen - 1) / _median([r["decode_s"] for r in timed]),
            "e2e_tokens_per_s": gen / _median([r["wall_s"] for r in timed]),
            "rounds": [{k: r[k] for k in ("ttft_s", "decode_s", "wall_s")} for r in timed],
        }
        del engine, loaded
        gc.collect()
        return row

    return run


def llama_cpp_runner(path: Path, prompt: list[int], gen: int, rounds: int,
                     threads: int) -> dict[str, Any] | None:
    return measure_llama_cpp(path, prompt, gen, rounds, threads)


# (row name, what the weights are, runner) in the order they run and print
ENGINES: list[tuple[str, str, Runner]] = [
    ("infbench Q4_1 native, int8 act", "Q4_1 as stored (int4/32), int8 activations per 32 "
     "columns: llama.cpp's arithmetic", infbench_runner("native", "int8")),
    ("infbench Q4_1 native", "Q4_1 as stored (int4/32), fp32 activations",
     infbench_runner("native")),
    ("infbench float32", "dequantized to float32", infbench_runner("none")),
    ("llama.cpp", "Q4_1 (the GGUF file)", llama_cpp_runner),
]
# The target compares like with like: llama.cpp rounds activations to int8 (Q8_1 blocks of
# 32) for its Q4_1 dot products, as the first row does.
NATIVE, NATIVE_FLOAT, PEER = ENGINES[0][0], ENGINES[1][0], ENGINES[3][0]


def evaluate_target(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 12: infbench's Q4_1 native decode at least as fast as llama.cpp's, both with int8
    activations (the float-activation row's ratio is in the detail)."""
    by_name = {r["engine"]: r for r in rows}
    ours, theirs = by_name.get(NATIVE), by_name.get(PEER)
    label = "batch 1 decode: infbench Q4_1 native, int8 act / llama.cpp (same file)"
    if ours is None or theirs is None:
        missing = NATIVE if ours is None else PEER
        return {"target": label, "needed": 1.0, "measured": None, "status": "NOT RUN",
                "detail": f"needs the {missing} row"}
    a, b = ours["decode_tokens_per_s"], theirs["decode_tokens_per_s"]
    detail = f"{a:.1f} / {b:.1f} tok/s"
    floats = by_name.get(NATIVE_FLOAT)
    if floats is not None:
        f = floats["decode_tokens_per_s"]
        detail += f"; with fp32 activations {f:.1f} tok/s, {f / b:.2f}x"
    return {"target": label, "needed": 1.0, "measured": a / b,
            "status": "PASS" if a / b >= 1.0 else "NOT MET", "detail": detail}


def run(opts: Options, log: Callable[[str], None],
        engines: Sequence[tuple[str, str, Runner]] | None = None) -> dict[str, Any]:
    """Measure every engine; the result document (not yet written)."""
    from infbench.checkpoint.metadata import config_from_gguf, resolve_gguf
    from infbench.core.device import perf_flags
    from infbench.results.store import device_name, env_info

    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    threads = torch.get_num_threads()
    load_before = load_average()
    path = resolve_gguf("smollm2-135m")
    prompt = random_prompts(1, opts.prompt, config_from_gguf(path).vocab_size)[0]
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for name, weights, runner in ENGINES if engines is None else engines:
        log(f"{name}: warm-up + {opts.rounds} rounds")
        row = runner(path, prompt, opts.gen, opts.rounds, threads)
        if row is None:
            log(f"{name}: {NOT_INSTALLED}")
            skipped.append({"engine": name, "reason": NOT_INSTALLED})
            continue
        rows.append({"engine": name, "weights": weights, **row})
    return {
        "kind": KIND, "version": VERSION,
        "description": (__doc__ or "").split("\n\n")[0],
        "method": "one process; each engine: one warm-up, then args.rounds timed rounds "
                  "(medians) on the same random prompt, greedy, EOS ignored, batch 1",
        "fields": FIELDS,
        "note": "the machine may be shared: compare the ratios of one run",
        "env": env_info("cpu"),
        "cpu": {"model": device_name("cpu"), "perf_flags": perf_flags(), "threads": threads},
        "model": {"name": "SmolLM2-135M", "gguf": path.name},
        "args": {"rounds": opts.rounds, "prompt": opts.prompt, "gen": opts.gen,
                 "quick": opts.quick, "threads": opts.threads},
        "rows": rows, "skipped": skipped, "target": evaluate_target(rows),
        "load_average": {"before": load_before, "after": load_average(),
                         "cores": os.cpu_count()},
    }


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def render(data: dict[str, Any]) -> list[Any]:
    """The engines' table, the skipped engines, the target and the machine's load."""
    from rich.table import Table
    from rich.text import Text

    a, cpu = data["args"], data["cpu"]
    table = Table(title=(f"SmolLM2-135M ({data['model']['gguf']}) on {cpu['model']}, "
                         f"{cpu['threads']} thread{'s' if cpu['threads'] != 1 else ''}: batch 1, "
                         f"{a['prompt']}-token prompt, {a['gen']} new tokens, greedy, median "
                         f"of {a['rounds']}"))
    table.add_column("engine", no_wrap=True)
    table.add_column("weights")
    for col in ("decode tok/s", "prefill tok/s", "e2e tok/s"):
        table.add_column(col, justify="right")
    for row in data["rows"]:
        table.add_row(row["engine"], row["weights"], _fmt(row["decode_tokens_per_s"]),
                      _fmt(row["prefill_tokens_per_s"]), _fmt(row["e2e_tokens_per_s"]))
    out: list[Any] = [table]
    for item in data["skipped"]:
        out.append(Text(f"{item['engine']}: {item['reason']}"))
    t = data["target"]
    measured = "" if t["measured"] is None else f" {t['measured']:.2f}x,"
    out.append(Text(f"target, {t['target']}:{measured} needed >= {t['needed']:.2f}x: "
                    f"{t['status']} ({t['detail']})"))
    out.append(Text(load_note(data["load_average"])))
    return out


def main(argv: list[str] | None = None) -> int:
    from infbench.benchmarks._main import bench_main

    return bench_main(argv, parse_args, run, render, min_width=120)


if __name__ == "__main__":
    sys.exit(main())
