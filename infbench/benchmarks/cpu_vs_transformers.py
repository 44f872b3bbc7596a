"""`make bench`, second table: infbench vs transformers (and llama.cpp) on SmolLM2-135M, CPU.

One process, one run.  For each precision (float32, bfloat16) and batch (1, 16) the two
engines alternate in rounds (one warm-up round, then `--rounds` timed rounds; medians) on
the same random prompts (128 tokens, 64 new tokens, greedy, EOS ignored), both holding
the same weights (the SmolLM2-135M GGUF, dequantized to the precision):

- infbench: `Engine.run` of the batch; decode tok/s from its decode steps (tokens after
  the first over the time of the steps that produced them), prefill tok/s from its
  records (prompt tokens over the time until every request has its first token), MBU
  from the bytes each decode step must move (`roofline.costs.step_costs` of the step's
  real batch composition) over the step time, divided by the read bandwidth of a 1 GB
  buffer measured in every round of the same process;
- transformers `generate()`: a `max_new_tokens=1` call is the prefill (its prompt tokens
  over its time), a full call the end-to-end time, and decode tok/s is the tokens after
  the first over the difference of the two, paired per round.

The batch-16 rows are also the prefill-heavy case (16 x 128 = 2,048 prompt tokens: TTFT
of both engines).  Where `llama-cpp-python` is installed, llama.cpp runs the same GGUF
file (Q4_1, as shipped) at batch 1 with as many threads as torch uses, as a peer: it is
no dependency of infbench.  The speed targets (`evaluate_targets`) are judged from the measured rows
and printed as PASS / NOT MET; all of it goes to a JSON file that describes itself.

On a shared machine compare the ratios of one run (both engines see the same load),
not absolute numbers across runs.

    python -m infbench.benchmarks.cpu_vs_transformers [--precisions float32,bfloat16]
        [--batches 1,16] [--rounds 3] [--prompt 128] [--gen 64]
        [--threads N] [--out results/bench_cpu.json] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

KIND = "infbench.bench.cpu_vs_transformers"
VERSION = 2
PRECISIONS = ("float32", "bfloat16")
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
TARGET_BATCH = 16  # the batched target and its prefill-heavy case
ENGINES = ("infbench", "transformers")

# Defaults of a full run and of --quick (tiny sizes, for a test); an option given on the
# command line wins over either.
FULL: dict[str, Any] = {"precisions": "float32,bfloat16", "batches": "1,16", "rounds": 3,
                        "prompt": 128, "gen": 64, "bandwidth_bytes": 1 << 30,
                        "bandwidth_s": 0.5}
QUICK: dict[str, Any] = {"precisions": "float32,bfloat16", "batches": "1,16", "rounds": 1,
                         "prompt": 8, "gen": 6, "bandwidth_bytes": 64 << 20,
                         "bandwidth_s": 0.1}

# What every number in the JSON means (written into the file itself).
FIELDS = {
    "rows[].infbench|transformers.decode_tokens_per_s":
        "tokens after each request's first / the time that produced them (median of rounds); "
        "infbench: its decode steps; transformers: full generate() minus the "
        "max_new_tokens=1 call of the same round",
    "rows[].infbench|transformers.prefill_tokens_per_s":
        "prompt tokens of the batch / time to first token of every request (median of rounds); "
        "transformers: the max_new_tokens=1 generate() call",
    "rows[].infbench|transformers.ttft_s": "time to first token of the whole batch, s (median)",
    "rows[].infbench|transformers.e2e_tokens_per_s":
        "batch x new tokens / wall time of the whole generation (median of rounds)",
    "rows[].infbench|transformers.rounds": "the timed rounds, seconds, in order",
    "rows[].speedup": "infbench / transformers for decode, prefill and end-to-end tokens/s",
    "rows[].mbu": "infbench decode: bytes the roofline cost model says a decode step moves "
                  "(weights + KV, step_costs of each step's batch) per second of decode steps, "
                  "over the read bandwidth measured in the same rounds (median of rounds)",
    "llama_cpp": "llama.cpp (llama-cpp-python) on the same GGUF file, Q4_1, batch 1; "
                 "null when not installed",
    "targets": "the speed targets evaluated from rows: PASS, NOT MET, or NOT RUN (the row "
               "it needs was not measured)",
    "load_average": "the machine's 1/5/15-minute load averages at the start and the end of the "
                    "run, and its core count: a load above the cores means other processes "
                    "competed for the CPU (absolute figures drop, ratios of one run hold better)",
}


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS does not say)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def load_note(load: dict[str, Any]) -> str:
    """One line on how busy the machine was, and a warning when it was oversubscribed."""
    cores, before, after = load["cores"], load["before"], load["after"]
    if before is None or after is None:
        return "load average: not available on this OS"
    line = (f"load average (1 min) {before[0]:.1f} at the start, {after[0]:.1f} at the end, "
            f"on {cores} cores")
    if cores and max(before[0], after[0]) > cores:
        line += ("; other processes competed for the CPU: absolute figures are low, compare "
                 "the ratios of this run")
    return line


# ---------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    precisions: list[str]
    batches: list[int]
    rounds: int
    prompt: int
    gen: int
    out: str
    quick: bool
    threads: int | None  # torch intra-op threads for both engines and llama.cpp (None: default)
    bandwidth_bytes: int
    bandwidth_s: float


def parse_args(argv: list[str] | None) -> Options:
    """The options; a bad value raises UserError naming it."""
    from infbench.core.errors import UserError

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--precisions", help=f"comma-separated, of {', '.join(PRECISIONS)} "
                                             f"(default {FULL['precisions']})")
    parser.add_argument("--batches",
                        help=f"comma-separated batch sizes (default {FULL['batches']})")
    parser.add_argument("--rounds", type=int, help=f"timed rounds (default {FULL['rounds']})")
    parser.add_argument("--prompt", type=int, help=f"prompt tokens (default {FULL['prompt']})")
    parser.add_argument("--gen", type=int, help=f"new tokens, >= 2 (default {FULL['gen']})")
    parser.add_argument("--out", default="results/bench_cpu.json", help="the JSON file")
    parser.add_argument("--threads", type=int,
                        help="CPU threads for both engines and llama.cpp (default: torch's, "
                             "one per core); on a shared machine 1 avoids stalls on threads "
                             "the OS has descheduled")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes for a test: {QUICK['prompt']}-token prompts, "
                             f"{QUICK['gen']} new tokens, {QUICK['rounds']} round")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return base[name] if value is None else value

    precisions = [p.strip() for p in str(pick("precisions")).split(",") if p.strip()]
    bad = [p for p in precisions if p not in PRECISIONS]
    if not precisions or bad or len(set(precisions)) != len(precisions):
        raise UserError(f"--precisions: {pick('precisions')!r}: give distinct values of "
                        f"{', '.join(PRECISIONS)}, comma-separated")
    try:
        batches = [int(b) for b in str(pick("batches")).split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or len(set(batches)) != len(batches):
        raise UserError(f"--batches: {pick('batches')!r}: give distinct integers >= 1, "
                        "comma-separated")
    for name, low in (("rounds", 1), ("prompt", 1), ("gen", 2)):
        if pick(name) < low:
            raise UserError(f"--{name} must be >= {low}, got {pick(name)}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    return Options(precisions=precisions, batches=batches, rounds=pick("rounds"),
                   prompt=pick("prompt"), gen=pick("gen"), out=args.out, quick=args.quick,
                   threads=args.threads,
                   bandwidth_bytes=base["bandwidth_bytes"], bandwidth_s=base["bandwidth_s"])


# ---------------------------------------------------------------------- measuring
def random_prompts(batch: int, prompt_len: int, vocab_size: int) -> list[list[int]]:
    """`batch` random prompts, seeded by the batch size (the same for every precision)."""
    gen = torch.Generator().manual_seed(1000 + batch)
    ids: list[list[int]] = torch.randint(10, vocab_size, (batch, prompt_len),
                                         generator=gen).tolist()
    return ids


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


class DecodeBytes:
    """Bytes one engine step moves by the roofline cost model, memoized per batch shape."""

    def __init__(self, cfg: Any, dtype: str) -> None:
        self.cfg, self.dtype = cfg, dtype
        self.memo: dict[tuple[tuple[int, int, int], ...], float] = {}

    def __call__(self, step: Any) -> float:
        from infbench.core.config import QuantConfig
        from infbench.roofline.costs import SeqWork, step_costs, total

        key = tuple(zip(step.query_lens, step.context_lens,
                        step.logits_lens or [1] * len(step.query_lens), strict=True))
        if key not in self.memo:
            seqs = [SeqWork(q, c, n) for q, c, n in key]
            self.memo[key] = total(step_costs(self.cfg, seqs, self.dtype, QuantConfig())).bytes
        return self.memo[key]


def infbench_round(engine: Any, requests: Sequence[Any], step_bytes: Callable[[Any], float],
                   gen: int) -> dict[str, float]:
    """One `Engine.run` of the batch: wall, TTFT, decode time, tokens and bytes."""
    res = engine.run(requests)
    decode = [s for s in res.steps if s.num_prefill_tokens == 0]
    out_tokens = sum(r.num_output_tokens for r in res.requests)
    if out_tokens != len(requests) * gen or not decode:
        raise RuntimeError(f"infbench produced {out_tokens} tokens in {len(decode)} decode "
                           f"steps; expected {len(requests)} x {gen} (EOS is ignored)")
    return {
        "wall_s": res.wall_s,
        "ttft_s": max(r.first_token_s - r.arrival_s for r in res.requests),
        "decode_s": sum(s.duration_s for s in decode),
        "decode_tokens": sum(s.num_decode_tokens for s in decode),
        "decode_bytes": sum(step_bytes(s) for s in decode),
    }


def hf_generate(model: Any, ids: torch.Tensor, new_tokens: int) -> float:
    """Seconds of one greedy `generate()` of exactly `new_tokens` (EOS suppressed)."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0)
    elapsed = time.perf_counter() - start
    if tuple(out.shape) != (ids.shape[0], ids.shape[1] + new_tokens):
        raise RuntimeError(f"transformers returned shape {tuple(out.shape)}")
    return elapsed


def measure_cell(engine: Any, hf_model: Any, prompts: list[list[int]], opts: Options,
                 step_bytes: DecodeBytes, bandwidth: Callable[[], float]) -> dict[str, Any]:
    """One precision x batch: warm-up, then `opts.rounds` alternating timed rounds."""
    from infbench.engine.request import Request, SamplingParams

    batch, gen = len(prompts), opts.gen
    requests = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=gen, ignore_eos=True))
                for i, p in enumerate(prompts)]
    ids = torch.tensor(prompts)
    infbench_round(engine, requests, step_bytes, gen)  # warm-up, both engines
    hf_generate(hf_model, ids, 1)
    hf_generate(hf_model, ids, gen)
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    bw: list[float] = []
    for _ in range(opts.rounds):
        ours.append(infbench_round(engine, requests, step_bytes, gen))
        prefill_s = hf_generate(hf_model, ids, 1)
        total_s = hf_generate(hf_model, ids, gen)
        theirs.append({"prefill_s": prefill_s, "total_s": total_s})
        bw.append(bandwidth())
    return summarize_cell(batch, opts.prompt, gen, ours, theirs, bw)


def summarize_cell(batch: int, prompt: int, gen: int, ours: list[dict[str, float]],
                   theirs: list[dict[str, float]], bandwidths: list[float]) -> dict[str, Any]:
    """Medians over rounds, rates, speed-ups and MBU of one cell from its raw rounds."""
    prompt_tokens, decode_tokens = batch * prompt, batch * (gen - 1)
    ttft = _median([r["ttft_s"] for r in ours])
    decode_s = _median([r["decode_s"] for r in ours])
    wall = _median([r["wall_s"] for r in ours])
    achieved = _median([r["decode_bytes"] / r["decode_s"] for r in ours])
    read_bw = _median(bandwidths)
    rates = {"decode": decode_tokens / decode_s, "prefill": prompt_tokens / ttft,
             "e2e": batch * gen / wall}
    infbench = {**{f"{k}_tokens_per_s": v for k, v in rates.items()}, "ttft_s": ttft,
                "rounds": ours}
    hf_prefill = _median([r["prefill_s"] for r in theirs])
    hf_total = _median([r["total_s"] for r in theirs])
    # Paired per round; on a noisy machine a tiny run can read prefill >= total.
    hf_decode = _median([r["total_s"] - r["prefill_s"] for r in theirs])
    hf_rates = {"decode": decode_tokens / hf_decode if hf_decode > 0 else None,
                "prefill": prompt_tokens / hf_prefill, "e2e": batch * gen / hf_total}
    transformers = {**{f"{k}_tokens_per_s": v for k, v in hf_rates.items()},
                    "ttft_s": hf_prefill, "rounds": theirs}
    speedup = {k: _ratio(rates[k], hf_rates[k]) for k in rates}
    return {
        "batch": batch, "prompt_tokens": prompt_tokens, "new_tokens_per_request": gen,
        "infbench": infbench, "transformers": transformers, "speedup": speedup,
        "mbu": {"mbu": achieved / read_bw, "achieved_bytes_per_s": achieved,
                "read_bandwidth_bytes_per_s": read_bw, "read_bandwidth_rounds": bandwidths,
                "decode_bytes_per_round": _median([r["decode_bytes"] for r in ours])},
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def measure_llama_cpp(model_path: Path, prompt: list[int], gen: int, rounds: int,
                      threads: int) -> dict[str, Any] | None:
    """llama.cpp on the GGUF file at batch 1 (None when llama-cpp-python is not installed).

    Greedy by llama.cpp's own sampler (temperature 0, no repeat penalty); it never stops at
    EOS because the loop runs the tokens itself: eval the prompt, sample the first token
    (TTFT), then gen - 1 times eval the last token and sample the next.
    """
    try:
        import llama_cpp
    except ImportError:
        return None
    kwargs: dict[str, Any] = {"model_path": str(model_path), "n_ctx": len(prompt) + gen,
                              "n_batch": max(512, len(prompt)), "n_threads": threads,
                              "verbose": False}
    if "n_threads_batch" in inspect.signature(llama_cpp.Llama).parameters:
        kwargs["n_threads_batch"] = threads  # prompt processing: the same threads
    llm = llama_cpp.Llama(**kwargs)

    def one_round() -> dict[str, float]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        token = llm.sample(temp=0.0, repeat_penalty=1.0)
        first = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([token])
            token = llm.sample(temp=0.0, repeat_penalty=1.0)
        end = time.perf_counter()
        return {"ttft_s": first - start, "decode_s": end - first, "wall_s": end - start}

    one_round()  # warm-up
    timed = [one_round() for _ in range(rounds)]
    ttft = _median([r["ttft_s"] for r in timed])
    return {
        "version": getattr(llama_cpp, "__version__", None), "weights": "Q4_1 (the GGUF file)",
        "batch": 1, "n_threads": threads, "ttft_s": ttft,
        "prefill_tokens_per_s": len(prompt) / ttft,
        "decode_tokens_per_s": (gen - 1) / _median([r["decode_s"] for r in timed]),
        "e2e_tokens_per_s": gen / _median([r["wall_s"] for r in timed]),
        "rounds": timed,
    }


# ---------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    key: str
    label: str
    needed: float  # measured >= needed passes
    percent: bool = False  # shown as a percentage (else as a ratio, "2.00x")


def _find(rows: Sequence[dict[str, Any]], precision: str, batch: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["precision"] == precision and r["batch"] == batch), None)


def _rate(row: dict[str, Any], engine: str, what: str) -> float | None:
    value = row[engine][f"{what}_tokens_per_s"]
    return float(value) if value is not None else None


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 11's CPU targets, each computed from the measured rows.

    Batch 1: the best infbench precision at least 2x the best transformers precision
    (decode tok/s); batch 16: at least 1.5x transformers in the same precision (decode
    tok/s); bf16 batch-1 MBU at least 80%; prefill tok/s of the batch-16 prompts (the
    prefill-heavy case) at least 1.5x transformers in the same precision.  A target whose
    row was not measured is NOT RUN.
    """
    out: list[dict[str, Any]] = []

    def add(target: Target, measured: float | None, detail: str) -> None:
        status = ("NOT RUN" if measured is None
                  else "PASS" if measured >= target.needed else "NOT MET")
        out.append({"key": target.key, "target": target.label, "needed": target.needed,
                    "measured": measured, "status": status, "detail": detail,
                    "percent": target.percent})

    t = Target("batch1_best_vs_best",
               "batch 1 decode: best infbench precision / best transformers precision", 2.0)
    best: dict[str, tuple[float, str]] = {}
    for engine in ENGINES:
        rates = [(v, r["precision"]) for r in rows if r["batch"] == 1
                 for v in [_rate(r, engine, "decode")] if v is not None]
        if rates:
            best[engine] = max(rates)
    if len(best) == len(ENGINES):
        (a, pa), (b, pb) = best["infbench"], best["transformers"]
        add(t, a / b, f"infbench {SHORT[pa]} {a:.1f} / transformers {SHORT[pb]} {b:.1f} tok/s")
    else:
        add(t, None, "needs batch-1 rows of both engines")
    for precision in PRECISIONS:
        t = Target(f"batch{TARGET_BATCH}_{precision}",
                   f"batch {TARGET_BATCH} decode, {SHORT[precision]}: infbench / transformers", 1.5)
        row = _find(rows, precision, TARGET_BATCH)
        x = _rate(row, "infbench", "decode") if row else None
        y = _rate(row, "transformers", "decode") if row else None
        if x is None:
            add(t, None, f"needs the {SHORT[precision]} batch-{TARGET_BATCH} row")
        elif y is None:
            add(t, None, "transformers' decode time not measurable: its max_new_tokens=1 "
                         "call took as long as the full one (noise)")
        else:
            add(t, x / y, f"{x:.1f} / {y:.1f} tok/s")
    t = Target("mbu_bfloat16_batch1", "bf16 batch-1 decode MBU", 0.80, percent=True)
    row = _find(rows, "bfloat16", 1)
    if row is None:
        add(t, None, "needs the bf16 batch-1 row")
    else:
        m = row["mbu"]
        add(t, float(m["mbu"]), f"{m['achieved_bytes_per_s'] / 1e9:.1f} of "
                                f"{m['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
    for precision in PRECISIONS:
        row = _find(rows, precision, TARGET_BATCH)
        tokens = row["prompt_tokens"] if row else None
        t = Target(f"prefill_{precision}",
                   f"prefill, batch {TARGET_BATCH}"
                   f"{f' ({tokens} prompt tokens)' if tokens else ''}, "
                   f"{SHORT[precision]}: infbench / transformers", 1.5)
        if row is None:
            add(t, None, f"needs the {SHORT[precision]} batch-{TARGET_BATCH} row")
        else:
            a, b = row["infbench"]["ttft_s"], row["transformers"]["ttft_s"]
            add(t, row["speedup"]["prefill"], f"TTFT {a:.2f} s / {b:.2f} s")
    return out


# ---------------------------------------------------------------------- output
def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render(data: dict[str, Any]) -> list[Any]:
    """What to print: engines side by side, prefill-heavy case, targets, machine load."""
    from rich.table import Table
    from rich.text import Text

    a, cpu = data["args"], data["cpu"]
    flags = " ".join(cpu["perf_flags"]) or "none of the listed flags"
    main = Table(title=(f"SmolLM2-135M on {cpu['model']} ({flags}), {cpu['threads']} "
                        f"thread{'s' if cpu['threads'] != 1 else ''}: "
                        f"{a['prompt']}-token prompts, {a['gen']} new tokens, greedy, median of "
                        f"{a['rounds']}"),
                 caption=("decode: tokens after the first / their time; prefill: prompt tokens "
                          "/ TTFT; MBU: infbench decode-step bytes (cost model) per s / the read "
                          "bandwidth of a buffer past the caches, measured in the same rounds"))
    main.add_column("dtype")
    main.add_column("batch", justify="right")
    main.add_column("engine", no_wrap=True, min_width=len("transformers"))
    for col in ("decode tok/s", "prefill tok/s", "e2e tok/s", "MBU", "read GB/s"):
        main.add_column(col, justify="right")
    for row in data["rows"]:
        for engine in ENGINES:
            e, first = row[engine], engine == ENGINES[0]
            main.add_row(SHORT[row["precision"]] if first else "",
                         str(row["batch"]) if first else "", engine,
                         _fmt(e["decode_tokens_per_s"]), _fmt(e["prefill_tokens_per_s"]),
                         _fmt(e["e2e_tokens_per_s"]),
                         f"{100 * row['mbu']['mbu']:.0f}%" if first else "",
                         f"{row['mbu']['read_bandwidth_bytes_per_s'] / 1e9:.1f}" if first else "")
        s = row["speedup"]
        main.add_row("", "", "speed-up", _fmt(s["decode"], ".2f", "x"),
                     _fmt(s["prefill"], ".2f", "x"), _fmt(s["e2e"], ".2f", "x"), "", "",
                     end_section=True)
    llama = data["llama_cpp"]
    if llama is not None:
        main.add_row("Q4_1", "1", "llama.cpp", _fmt(llama["decode_tokens_per_s"]),
                     _fmt(llama["prefill_tokens_per_s"]), _fmt(llama["e2e_tokens_per_s"]),
                     "", "")
    tables: list[Any] = [main]
    heavy = [r for r in data["rows"] if r["batch"] == TARGET_BATCH]
    if heavy:
        prefill = Table(title=f"prefill-heavy: batch {TARGET_BATCH} x {a['prompt']} = "
                              f"{heavy[0]['prompt_tokens']} prompt tokens, time to first token")
        for col in ("precision", "infbench TTFT s", "transformers TTFT s", "speed-up"):
            prefill.add_column(col, justify="left" if col == "precision" else "right")
        for row in heavy:
            prefill.add_row(SHORT[row["precision"]], f"{row['infbench']['ttft_s']:.2f}",
                            f"{row['transformers']['ttft_s']:.2f}",
                            _fmt(row["speedup"]["prefill"], ".2f", "x"))
        tables.append(prefill)
    targets = Table(title="speed targets (this run)")
    for col in ("target", "measured", "needed", "status"):
        targets.add_column(col, justify="left" if col in ("target", "status") else "right")
    for t in data["targets"]:
        spec, scale, suffix = (".0f", 100, "%") if t["percent"] else (".2f", 1, "x")
        measured = None if t["measured"] is None else scale * t["measured"]
        targets.add_row(f"{t['target']} ({t['detail']})", _fmt(measured, spec, suffix),
                        f">= {scale * t['needed']:{spec}}{suffix}", t["status"])
    tables.append(targets)
    if "load_average" in data:
        tables.append(Text(load_note(data["load_average"])))
    return tables


# ---------------------------------------------------------------------- main
def _load_transformers(path: Path) -> Any:
    """transformers' model of the GGUF file, dequantized to float32 (as infbench's is)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generation-flag notices would interleave the tables
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


def run(opts: Options, log: Callable[[str], None]) -> dict[str, Any]:
    """Measure everything `opts` asks for; the result document (not yet written)."""
    from infbench.checkpoint.metadata import resolve_gguf
    from infbench.core.config import EngineConfig
    from infbench.core.device import auto_dtype, perf_flags
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.measure.calibrate import measure_reference_bandwidth
    from infbench.model.loader import load_model
    from infbench.results.store import device_name, env_info

    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    threads = torch.get_num_threads()
    load_before = load_average()
    path = resolve_gguf("smollm2-135m")
    log(f"loading SmolLM2-135M from {path} (transformers, float32)")
    hf_base = _load_transformers(path)

    def bandwidth() -> float:
        return measure_reference_bandwidth("cpu", seconds=opts.bandwidth_s,
                                           nbytes=opts.bandwidth_bytes)

    rows: list[dict[str, Any]] = []
    backends: dict[str, str] = {}
    prompts_b1: list[int] | None = None
    vocab_size = 0
    for precision in opts.precisions:
        log(f"loading SmolLM2-135M in {precision} (infbench)")
        loaded = load_model({"gguf": "smollm2-135m"}, dtype=precision, device="cpu")
        # The same dequantized weights rounded the same way as a bfloat16 load would.
        hf_model = (hf_base if precision == "float32"
                    else copy.deepcopy(hf_base).to(getattr(torch, precision)))
        step_bytes = DecodeBytes(loaded.config, precision)
        vocab_size = loaded.config.vocab_size
        for batch in opts.batches:
            prompts = random_prompts(batch, opts.prompt, loaded.config.vocab_size)
            if batch == 1:
                prompts_b1 = prompts[0]
            reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=opts.gen,
                                                              ignore_eos=True))
                    for i, p in enumerate(prompts)]
            # The whole batch's prompts in one prefill step, as transformers runs them.
            engine_cfg = EngineConfig(max_num_seqs=batch,
                                      max_num_batched_tokens=max(2048, batch * opts.prompt))
            engine = Engine.create(loaded, engine_cfg, "cpu", precision,
                                   sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
            backends[precision] = engine.ops.name
            log(f"{precision} batch {batch}: warm-up + {opts.rounds} rounds "
                f"(infbench backend {engine.ops.name})")
            row = {"precision": precision,
                   **measure_cell(engine, hf_model, prompts, opts, step_bytes, bandwidth)}
            rows.append(row)
            del engine
            gc.collect()
        del loaded, hf_model
        gc.collect()
    del hf_base
    gc.collect()

    if prompts_b1 is None:
        prompts_b1 = random_prompts(1, opts.prompt, vocab_size)[0]
    llama = measure_llama_cpp(path, prompts_b1, opts.gen, opts.rounds, threads)
    if llama is None:
        log("llama.cpp: llama-cpp-python is not installed (a peer to compare with, not a "
            "dependency): no llama.cpp row")
    chosen, why = auto_dtype("cpu")
    return {
        "kind": KIND,
        "version": VERSION,
        "description": (__doc__ or "").split("\n\n")[0],
        "method": "one process; per precision and batch, infbench and transformers in "
                  "alternating rounds (one warm-up, then args.rounds timed; medians) on the "
                  "same random prompts, greedy, EOS ignored",
        "fields": FIELDS,
        "note": "the machine may be shared: compare the ratios of one run",
        "env": env_info("cpu"),
        "cpu": {"model": device_name("cpu"), "perf_flags": perf_flags(), "threads": threads,
                "auto_dtype": chosen, "auto_dtype_reason": why},
        "model": {"name": "SmolLM2-135M", "gguf": path.name,
                  "weights": "the GGUF's Q4_1 weights dequantized to each precision "
                             "(both engines); llama.cpp runs them as Q4_1"},
        "args": {"precisions": opts.precisions, "batches": opts.batches,
                 "rounds": opts.rounds, "prompt": opts.prompt, "gen": opts.gen,
                 "quick": opts.quick, "threads": opts.threads,
                 "bandwidth_buffer_bytes": opts.bandwidth_bytes,
                 "bandwidth_seconds": opts.bandwidth_s},
        "infbench_backends": backends,
        "rows": rows,
        "llama_cpp": llama,
        "targets": evaluate_targets(rows),
        "load_average": {"before": load_before, "after": load_average(),
                         "cores": os.cpu_count()},
    }


def main(argv: list[str] | None = None) -> int:
    from infbench.benchmarks._main import bench_main

    return bench_main(argv, parse_args, run, render)


if __name__ == "__main__":
    sys.exit(main())
