"""`make bench` (serving): what `infbench serve` adds over the in-process engine, and what a
second replica buys on this machine.

`python -m infbench.benchmarks.serving` measures, on one model (default SmolLM2-135M from
its GGUF, float32, the `cpu` backend):

1. Server overhead at batch 1: `--requests` requests of `--prompt` random tokens and
   `--gen` new tokens (greedy, EOS ignored), one after another, first through the engine in
   this process (`Engine.run`, one request per run), then through an `infbench serve`
   process with the same model, engine settings and `--threads` (default 1), streamed by infbench's
   own client (`infbench.client`, the `target:` backend).  Per request: TTFT (to the first
   token; over HTTP, to the first non-empty chunk) and TPOT ((last - first token) / (n - 1)).
   The figures are the medians' differences; the targets are at most 5 ms added to
   TTFT p50 and at most 1 ms added per output token.
2. Replicas: `infbench serve --replicas N --threads-per-replica 1` for N = 1 and 2 (the
   router in front in both cases), under a load that saturates one replica:
   `--load-requests` requests offered at once with `--concurrency` in flight.  Output
   tokens/s, TTFT p50 and TPOT p50 per N, beside the analytic expectation: N x the
   throughput of one replica at unchanged per-request latency, while each replica has a
   core of its own.  The client and the router run in this process, on the same cores as
   the replicas.

Prints a table per part and writes `--out` (JSON).  Comparing ratios within one run is the
point: the machine is shared.

    python -m infbench.benchmarks.serving [--model smollm2-135m] [--requests 8]
        [--prompt 128] [--gen 64] [--load-requests 24] [--concurrency 8]
        [--out results/bench_serving.json] [--skip-replicas] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch

from infbench.benchmarks.cpu_vs_transformers import load_average, load_note, random_prompts
from infbench.engine.records import RequestRecord
from infbench.engine.request import Request, SamplingParams

KIND = "infbench.bench.serving"
VERSION = 1
TTFT_TARGET_S = 5e-3
TPOT_TARGET_S = 1e-3
FULL: dict[str, Any] = {"requests": 8, "prompt": 128, "gen": 64, "load_requests": 24,
                        "concurrency": 8}
QUICK: dict[str, Any] = {"requests": 2, "prompt": 8, "gen": 6, "load_requests": 4,
                         "concurrency": 2}


@dataclass(frozen=True)
class Options:
    model: str
    requests: int
    prompt: int
    gen: int
    load_requests: int
    concurrency: int
    out: str
    skip_replicas: bool
    quick: bool
    threads: int = 1


def parse_args(argv: list[str] | None) -> Options:
    from infbench.core.errors import UserError

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model infbench serve loads")
    for name, help_ in (("requests", "batch-1 requests per side"),
                        ("prompt", "prompt tokens"), ("gen", "new tokens (>= 2)"),
                        ("load-requests", "requests of the replica load"),
                        ("concurrency", "requests in flight in the replica load")):
        parser.add_argument(f"--{name}", type=int,
                            help=f"{help_} (default {FULL[name.replace('-', '_')]})")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the overhead part, both sides (default 1: a "
                             "2-thread OpenMP region slows down many-fold when another "
                             "process holds the second core, and the overhead is host work)")
    parser.add_argument("--out", default="results/bench_serving.json")
    parser.add_argument("--skip-replicas", action="store_true", help="only the overhead part")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a test")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> int:
        value = getattr(args, name)
        return int(base[name] if value is None else value)

    for name, low in (("requests", 1), ("prompt", 1), ("gen", 2), ("load_requests", 1),
                      ("concurrency", 1)):
        if pick(name) < low:
            raise UserError(f"--{name.replace('_', '-')} must be >= {low}, got {pick(name)}")
    if args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    return Options(model=args.model, requests=pick("requests"), prompt=pick("prompt"),
                   gen=pick("gen"), load_requests=pick("load_requests"),
                   concurrency=pick("concurrency"), out=args.out,
                   skip_replicas=args.skip_replicas, quick=args.quick, threads=args.threads)


# ------------------------------------------------------------------------ figures
def ttft(rec: RequestRecord) -> float:
    return rec.token_times_s[0] - rec.arrival_s


def tpot(rec: RequestRecord) -> float | None:
    t = rec.token_times_s
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


def summarize(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    tpots = [x for x in (tpot(r) for r in records) if x is not None]
    out_tokens = sum(len(r.token_times_s) for r in records)
    return {"num_requests": len(records), "output_tokens": out_tokens, "wall_s": wall_s,
            "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else None,
            "ttft_p50_s": statistics.median(ttft(r) for r in records) if records else None,
            "tpot_p50_s": statistics.median(tpots) if tpots else None,
            "tpot_mean_s": statistics.fmean(tpots) if tpots else None}


def _requests(opts: Options, n: int, vocab: int, prefix: str) -> list[Request]:
    prompts = random_prompts(n, opts.prompt, vocab)
    return [Request(f"{prefix}{i:04d}", tuple(p), SamplingParams(max_tokens=opts.gen,
                                                                 ignore_eos=True))
            for i, p in enumerate(prompts)]


# ------------------------------------------------------------------ server process
class ServeProcess:
    """`infbench serve ARGS` on a free loopback port until the context ends."""

    def __init__(self, args: list[str]) -> None:
        from infbench.serve.replicas import free_port

        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ServeProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infbench.cli", "serve", *self.args, "--host", "127.0.0.1",
             "--port", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    err = (self.proc.stderr.read() if self.proc.stderr else b"").decode()
                    raise RuntimeError(f"infbench serve exited: {err.strip()[-300:]}") from None
                time.sleep(0.2)
        raise RuntimeError("infbench serve did not become healthy within 600 s")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def client_run(base_url: str, model: str, requests: list[Request],
               concurrency: int) -> tuple[list[RequestRecord], float, int]:
    """Stream `requests` through the target: (records, wall seconds, failures)."""
    from infbench.client.openai_target import ClientPlan, open_session, run_requests
    from infbench.scenario.target import TargetSection

    target = TargetSection(kind="openai", base_url=base_url, model=model)
    plan = ClientPlan(target, None, concurrency)

    async def main() -> Any:
        async with open_session(target, concurrency) as session:
            return await run_requests(plan, requests, session=session)

    run = asyncio.run(main())
    return run.records, run.wall_s, len(run.failures)


# ------------------------------------------------------------------------- part 1
def overhead(opts: Options, log: Any) -> dict[str, Any]:
    from infbench.checkpoint.metadata import model_source
    from infbench.core.config import EngineConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.llm import CPU_KV_CACHE_BYTES
    from infbench.model.loader import load_model

    threads = opts.threads
    torch.set_num_threads(threads)
    max_len = opts.prompt + opts.gen
    log(f"overhead: in-process engine, {opts.requests} requests at batch 1")
    loaded = load_model(model_source(opts.model), dtype="float32")
    vocab = loaded.config.vocab_size
    reqs = _requests(opts, opts.requests, vocab, "r")
    cfg = EngineConfig(kv_cache_memory=float(CPU_KV_CACHE_BYTES), num_threads=threads)
    engine = Engine.create(loaded, cfg, "cpu", "float32",
                           sizing=KVSizing.for_max_model_len(max_len, cfg))
    engine.run(reqs[:1])  # warm-up
    local: list[RequestRecord] = []
    t0 = time.perf_counter()
    for r in reqs:
        local += engine.run([r]).requests
    local_wall = time.perf_counter() - t0
    backend = engine.ops.name
    del engine, loaded
    gc.collect()
    log(f"overhead: infbench serve, the same {opts.requests} requests one at a time")
    args = ["--model", opts.model, "--dtype", "float32", "--device", "cpu",
            "--num-threads", str(threads), "--max-model-len", str(max_len),
            "--kv-cache-memory", str(float(CPU_KV_CACHE_BYTES))]
    with ServeProcess(args) as srv:
        client_run(srv.base_url, opts.model, reqs[:1], 1)  # warm-up
        served, served_wall, failed = client_run(srv.base_url, opts.model, reqs, 1)
    a, b = summarize(local, local_wall), summarize(served, served_wall)
    d_ttft = b["ttft_p50_s"] - a["ttft_p50_s"]
    d_tpot = b["tpot_mean_s"] - a["tpot_mean_s"]
    return {
        "threads": threads, "backend": backend, "vocab_size": vocab, "in_process": a,
        "served": b,
        "failures": failed,
        "added_ttft_p50_s": d_ttft, "added_tpot_mean_s": d_tpot,
        "targets": [
            {"target": "TTFT p50 added by the server", "needed_s": TTFT_TARGET_S,
             "measured_s": d_ttft, "status": "PASS" if d_ttft <= TTFT_TARGET_S else "NOT MET"},
            {"target": "time per output token added by the server", "needed_s": TPOT_TARGET_S,
             "measured_s": d_tpot, "status": "PASS" if d_tpot <= TPOT_TARGET_S else "NOT MET"},
        ],
    }


# ------------------------------------------------------------------------- part 2
def replicas(opts: Options, log: Any, vocab: int) -> dict[str, Any]:
    """`vocab`: the model's vocabulary size (the overhead part loaded the model already)."""
    reqs = _requests(opts, opts.load_requests, vocab, "q")
    rows = []
    for n in (1, 2):
        log(f"replicas: {n} x 1 thread, {opts.load_requests} requests, "
            f"{opts.concurrency} in flight")
        args = ["--model", opts.model, "--dtype", "float32", "--device", "cpu",
                "--max-model-len", str(opts.prompt + opts.gen)]
        # one replica is the plain server with one thread; two are replica processes of one
        # thread each behind the router (one more local hop per chunk: it counts against
        # the two-replica row)
        args += (["--num-threads", "1"] if n == 1 else
                 ["--replicas", str(n), "--threads-per-replica", "1",
                  "--router", "least_outstanding"])
        with ServeProcess(args) as srv:
            client_run(srv.base_url, opts.model, reqs[:opts.concurrency], opts.concurrency)
            recs, wall, failed = client_run(srv.base_url, opts.model, reqs, opts.concurrency)
        rows.append({"replicas": n, "failures": failed, **summarize(recs, wall)})
    one, two = rows
    scale = (two["output_tokens_per_s"] / one["output_tokens_per_s"]
             if one["output_tokens_per_s"] else None)
    return {"rows": rows, "throughput_scaling": scale,
            "expected": "2.00x throughput at unchanged latency (data parallel, one core each)",
            "ttft_p50_ratio": two["ttft_p50_s"] / one["ttft_p50_s"],
            "tpot_p50_ratio": two["tpot_p50_s"] / one["tpot_p50_s"]}


# --------------------------------------------------------------------------- main
def run(opts: Options, log: Any) -> dict[str, Any]:
    from infbench.core.device import perf_flags
    from infbench.results.store import device_name, env_info

    load_before = load_average()
    data: dict[str, Any] = {
        "kind": KIND, "version": VERSION, "description": (__doc__ or "").split("\n\n")[0],
        "note": "the machine may be shared: compare the ratios of one run",
        "env": env_info("cpu"),
        "cpu": {"model": device_name("cpu"), "perf_flags": perf_flags(),
                "cores": os.cpu_count()},
        "args": {"model": opts.model, "requests": opts.requests, "prompt": opts.prompt,
                 "gen": opts.gen, "load_requests": opts.load_requests,
                 "concurrency": opts.concurrency, "quick": opts.quick},
        "overhead": overhead(opts, log),
    }
    data["replicas"] = (None if opts.skip_replicas
                        else replicas(opts, log, data["overhead"]["vocab_size"]))
    data["load_average"] = {"before": load_before, "after": load_average(),
                            "cores": os.cpu_count()}
    return data


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def render(data: dict[str, Any]) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    o = data["overhead"]
    a = data["args"]
    t1 = Table(title=(f"{a['model']} on {data['cpu']['model']}, batch 1, {a['prompt']}-token "
                      f"prompts, {a['gen']} new tokens, {o['threads']} threads: in-process "
                      f"engine against infbench serve (medians of {a['requests']})"))
    for col in ("path", "TTFT p50 ms", "TPOT p50 ms", "TPOT mean ms", "requests"):
        t1.add_column(col, justify="right" if col != "path" else "left")
    for name, key in (("in-process Engine.run", "in_process"), ("infbench serve + client",
                                                                "served")):
        s = o[key]
        t1.add_row(name, _ms(s["ttft_p50_s"]), _ms(s["tpot_p50_s"]), _ms(s["tpot_mean_s"]),
                   str(s["num_requests"]))
    out: list[Any] = [t1]
    for t in o["targets"]:
        out.append(Text(f"target, {t['target']}: {t['measured_s'] * 1e3:+.2f} ms, needed <= "
                        f"{t['needed_s'] * 1e3:.0f} ms: {t['status']}"))
    r = data["replicas"]
    if r is not None:
        t2 = Table(title=(f"replicas of one thread each, {a['load_requests']} requests, "
                          f"{a['concurrency']} in flight"))
        for col in ("replicas", "output tok/s", "TTFT p50 ms", "TPOT p50 ms", "failures"):
            t2.add_column(col, justify="right")
        for row in r["rows"]:
            t2.add_row(str(row["replicas"]), f"{row['output_tokens_per_s']:.1f}",
                       _ms(row["ttft_p50_s"]), _ms(row["tpot_p50_s"]), str(row["failures"]))
        out.append(t2)
        out.append(Text(f"2 replicas / 1: throughput {r['throughput_scaling']:.2f}x, TTFT p50 "
                        f"{r['ttft_p50_ratio']:.2f}x, TPOT p50 {r['tpot_p50_ratio']:.2f}x "
                        f"(analytic: {r['expected']})"))
    out.append(Text(load_note(data["load_average"])))
    return out


def main(argv: list[str] | None = None) -> int:
    from infbench.benchmarks._main import bench_main

    return bench_main(argv, parse_args, run, render, min_width=120)


if __name__ == "__main__":
    sys.exit(main())
