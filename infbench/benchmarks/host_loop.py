"""`make bench`, first table: the engine's host loop per decode step over a model doing no work.

An engine step is scheduler -> input preparation -> forward -> sampling -> update, and
everything but the forward is Python on the host.  On a GPU that Python runs while the
device waits, so at batch 256 with 4k-token contexts it has to stay well under a
millisecond (the target is 1 ms per step).  This benchmark runs the real `Engine.step`
over `NullModel`, whose forward allocates zeros of the right shape and computes nothing,
and times each part of the step at batch 1, 64 and 256 after prefilling ~4000-token
prompts:

    python -m infbench.benchmarks.host_loop [--batches 1,64,256] [--prompt 4000]
        [--steps 60] [--json OUT]

Columns are medians over the measured decode steps, in microseconds: schedule
(`Scheduler.schedule`), prepare (`ModelRunner.prepare`: token ids, positions, slot
mapping, block tables as tensors), execute (the NullModel forward and logits, ~0 by
construction), sample (the rest of `ModelRunner.execute`: block copies and the sampler),
update (`Scheduler.update`: progress, prefix hashes, stop checks) and record (the rest
of `Engine.step`: its StepRecord); total is the whole `Engine.step`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from infbench.engine.engine import Engine
    from infbench.model.context import AttentionContext

PARTS = ("schedule", "prepare", "execute", "sample", "update", "record", "total")
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


class NullModel:
    """A `LanguageModel` that computes nothing: a measuring instrument for the host loop.

    Its forward returns zeros of the hidden state's shape (T, hidden_size) and its logits
    zeros of (N, vocab_size), so every greedy sample is token 0; the engine around it does
    all its real bookkeeping (scheduling, block tables, slot mappings, sampling) and only
    the model's arithmetic is missing.  It never reads the KV cache or the context.
    """

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.seconds = 0.0  # time spent in forward + logits since the last reset

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 ctx: AttentionContext) -> torch.Tensor:
        import torch

        begin = time.perf_counter()
        hidden = torch.zeros(input_ids.shape[0], self.hidden_size)  # (T, H)
        self.seconds += time.perf_counter() - begin
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch

        begin = time.perf_counter()
        logits = torch.zeros(hidden.shape[0], self.vocab_size)  # (N, V) float32
        self.seconds += time.perf_counter() - begin
        return logits


@dataclass
class StepSplit:
    """Per-step seconds of each part of `Engine.step`, recorded by wrapping its pieces.

    The wrappers are instance attributes on the engine's scheduler and runner, so the
    engine code itself runs unchanged; `install` must be called again after
    `Engine.reset` (which builds a new scheduler).
    """

    steps: list[dict[str, float]] = field(default_factory=list)
    _cur: dict[str, float] = field(default_factory=dict)

    def install(self, engine: Engine, model: NullModel) -> None:
        sched, runner = engine.scheduler, engine.runner
        self._model = model
        sched.schedule = self._timed("schedule", sched.schedule)  # type: ignore[method-assign]
        sched.update = self._timed("update", sched.update)  # type: ignore[method-assign]
        runner.prepare = self._timed("prepare", runner.prepare)  # type: ignore[method-assign]
        runner.execute = self._timed(  # type: ignore[method-assign]
            "execute_all", runner.execute)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._cur[name] = self._cur.get(name, 0.0) + time.perf_counter() - begin
        return wrapper

    def step(self, engine: Engine) -> Any:
        """One `Engine.step`, its parts recorded; returns what the step returned."""
        self._cur = {}
        self._model.seconds = 0.0
        begin = time.perf_counter()
        result = engine.step(time.perf_counter)
        total = time.perf_counter() - begin
        cur = self._cur
        execute_all = cur.get("execute_all", 0.0)
        prepare, execute = cur.get("prepare", 0.0), self._model.seconds
        self.steps.append({
            "schedule": cur.get("schedule", 0.0),
            "prepare": prepare,
            "execute": execute,
            "sample": execute_all - prepare - execute,
            "update": cur.get("update", 0.0),
            "record": total - cur.get("schedule", 0.0) - execute_all - cur.get("update", 0.0),
            "total": total,
        })
        return result

    def medians(self) -> dict[str, float]:
        return {p: statistics.median(s[p] for s in self.steps) for p in PARTS}


def cpu_info() -> dict[str, Any]:
    """The CPU's model name and the flags that matter for this code (from /proc/cpuinfo)."""
    name, flags = "unknown", set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "unknown":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model_name": name, "flags": [f for f in RELEVANT_FLAGS if f in flags]}


def build_engine(batch: int, prompt_len: int, gen_len: int, seed: int = 0,
                 max_num_batched_tokens: int = 16384,
                 num_threads: int | None = None) -> tuple[Engine, NullModel]:
    """An engine over NullModel with `batch` requests of `prompt_len` random tokens queued.

    `num_threads` sets torch's intra-op threads for the whole process (None: unchanged).
    """
    from infbench.core.config import EngineConfig, ModelConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams

    # One layer, one KV head of 16 dims in fp16: the KV pool of 256 x 4k tokens is ~70 MB.
    cfg = ModelConfig.from_name("tiny", num_layers=1, num_heads=1, num_kv_heads=1,
                                hidden_size=16, max_seq_len=prompt_len + gen_len + 16)
    model = NullModel(cfg.hidden_size, cfg.vocab_size)
    engine_cfg = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max_num_batched_tokens,
                              backend="torch", num_threads=num_threads)
    rng = random.Random(seed)
    reqs = [Request(f"r{i}", tuple(rng.randrange(cfg.vocab_size) for _ in range(prompt_len)),
                    SamplingParams(max_tokens=gen_len, ignore_eos=True))
            for i in range(batch)]
    import torch

    engine = Engine(model, cfg, engine_cfg, torch.device("cpu"), "float16", weight_bytes=0,
                    sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
    for req in reqs:
        engine.add_request(req)
    return engine, model


def measure(batch: int, prompt_len: int = 4000, num_steps: int = 60, num_warmup: int = 5,
            num_threads: int | None = None) -> dict[str, Any]:
    """Prefill `batch` prompts, then time `num_steps` decode steps after `num_warmup`."""
    # Sequences whose prompt completes early decode while later ones still prefill: room
    # for those steps too, so that no sequence finishes inside the measured window.
    max_batched = 16384
    num_prefill_steps = -(-batch * prompt_len // max_batched) + 1
    engine, model = build_engine(batch, prompt_len, num_prefill_steps + num_warmup + num_steps + 1,
                                 max_num_batched_tokens=max_batched, num_threads=num_threads)
    split = StepSplit()
    split.install(engine, model)
    while engine.scheduler.waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
        split.step(engine)  # prefill, in max_num_batched_tokens chunks
    split.steps.clear()
    for _ in range(num_warmup):
        split.step(engine)
    split.steps.clear()
    for _ in range(num_steps):
        record, _ = split.step(engine)
        if record.num_decode_seqs != batch or record.num_prefill_tokens:
            raise RuntimeError(f"step {record.index} is not a decode of all {batch} sequences")
    seqs = engine.scheduler.running
    context = statistics.median(s.num_computed_tokens for s in seqs) if seqs else prompt_len
    return {"batch": batch, "context_tokens": context, "num_steps": num_steps,
            "median_s": split.medians()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--prompt", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=60, help="measured decode steps (>= 1)")
    parser.add_argument("--json", dest="json_out", default=None, help="also save rows here")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from infbench.results.store import env_info, write_json_atomic

    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if args.steps < 1 or args.prompt < 1 or not batches or min(batches) < 1:
        print("error: --steps, --prompt and every --batches entry must be integers >= 1, got "
              f"{args.steps}, {args.prompt}, {args.batches!r}", file=sys.stderr)
        return 2
    cpu = cpu_info()
    # One intra-op thread: the host loop is single-threaded Python, and idle torch threads
    # would only contend with it on a shared machine.
    rows = [measure(b, args.prompt, args.steps, num_threads=1) for b in batches]
    table = Table(title=f"host loop per decode step, NullModel, ~{args.prompt}-token contexts "
                        f"(median of {args.steps} steps, us)",
                  caption=f"{cpu['model_name']}; flags: {' '.join(cpu['flags']) or 'none'}")
    table.add_column("batch", justify="right")
    for part in PARTS:
        table.add_column(part, justify="right")
    for row in rows:
        med = row["median_s"]
        table.add_row(str(row["batch"]), *(f"{1e6 * med[p]:.0f}" for p in PARTS))
    Console().print(table)
    if args.json_out:
        write_json_atomic(args.json_out, {"kind": "infbench.bench.host_loop",
                                          "env": env_info("cpu"), "cpu": cpu,
                                          "args": vars(args), "rows": rows})
        Console(stderr=True).print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
