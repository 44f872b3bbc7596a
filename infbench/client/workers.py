"""`target.workers: N`: the client in N processes on this host, fed one arrival schedule.

One asyncio loop streams a few thousand tokens a second per core (benchmarks/
client_overhead.py); a fast server outruns it, and then the client, not the server, sets
the measured rate and its timestamps drift.  With `workers: N` the parent process:

1. draws the workload once (`generate_requests`, seeded, as for one process): the arrival
   process is one draw, not N independent streams, so its burstiness is the scenario's;
2. deals the requests out **round-robin in arrival order** (ties by request id; all
   samples of a prompt go to the same worker).  Round-robin keeps each worker's share an
   even thinning of the one schedule, deterministic and independent of the server's
   speed; a least-loaded assignment would depend on timing and so differ between repeats;
3. splits a concurrency cap (`workload.max_concurrency`, or `batch_size` of kind static)
   **evenly**: worker i may hold `cap // N` streams, plus one for the first `cap % N`
   workers, so at most `cap` streams are in flight in total.  The cap stays a global upper
   bound, but it is no longer work-conserving across workers: a worker whose slots are full
   queues its next request even if another worker has a free slot.  With round-robin
   shares of equal length this matters only in the tails; preflight refuses more workers
   than the cap has streams;
4. starts N `spawn` processes, each pinned with `os.sched_setaffinity` to one core of the
   parent's affinity set (worker i -> core i modulo the cores), each with its own event
   loop and connection pool (kept across warm-ups and repeats, as one process keeps its);
5. per pass, sends them one common start `t0 = time.perf_counter() + lead`.  On Linux
   `perf_counter` is `CLOCK_MONOTONIC`, one clock for every process of the host (checked by
   tests/client/test_workers.py: a child's reading lies between two of the parent's), so
   every worker's timestamps are already on the parent's clock, relative to the same t0;
6. merges the workers' records and failures by request id (the wall time is the last
   stream's end on that clock) and summarizes them with the same metrics code;
7. scrapes the target's /metrics (client/server_metrics.py) over the repeats from a thread
   of its own (`ThreadedScraper`), so the result holds `telemetry.server_metrics` as a
   one-process run's does.

Each request records its send error: the time it was handed to the connection pool minus
its scheduled arrival (`TargetRun.send_errors_s`; p50/p99/max in
`telemetry.client.send_error_s`, per request in the `requests` rows).

A worker that fails to start (or crashes) is one UserError naming the worker; the others
are stopped.  Past one host: docs/workers.md says what is and is not built.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from infbench.client.openai_target import (
    ClientPlan,
    Failure,
    TargetRun,
    fetch_models,
    open_session,
    run_requests,
)
from infbench.client.server_metrics import MetricsScraper, ThreadedScraper
from infbench.core.errors import UserError
from infbench.engine.records import RequestRecord
from infbench.engine.request import Request
from infbench.scenario.target import TargetSection, tokenizer_source

ASSIGNMENT = "round_robin"
START_LEAD_S = 0.05  # the common start is this far after the parent sends it
READY_TIMEOUT_S = 120.0  # a spawned worker imports infbench (and a tokenizer) first


def worker_shares(requests: Sequence[Request], num_workers: int) -> list[list[Request]]:
    """Requests dealt round-robin in arrival order (ties by id): worker i gets the i-th,
    (i+N)-th, ... arrival."""
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    return [ordered[i::num_workers] for i in range(num_workers)]


def worker_caps(cap: int | None, num_workers: int) -> list[int | None]:
    """A global cap of `cap` streams split evenly (the first cap % N workers get one more);
    None: no cap for anyone."""
    if cap is None:
        return [None] * num_workers
    if cap < num_workers:
        raise ValueError(f"{num_workers} workers cannot share a cap of {cap} stream(s)")
    return [cap // num_workers + (1 if i < cap % num_workers else 0)
            for i in range(num_workers)]


def worker_cores(num_workers: int) -> list[int]:
    """The core each worker is pinned to: the parent's allowed cores, round-robin."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return [cores[i % len(cores)] for i in range(num_workers)]


def merge_runs(runs: Sequence[TargetRun], t0: float) -> TargetRun:
    """The workers' passes as one: records and failures by id, the last end as wall time."""
    records: list[RequestRecord] = [r for run in runs for r in run.records]
    failures: list[Failure] = [f for run in runs for f in run.failures]
    errors = {k: v for run in runs for k, v in run.send_errors_s.items()}
    records.sort(key=lambda r: r.request_id)
    failures.sort(key=lambda f: f.request_id)
    wall = max((run.wall_s for run in runs), default=1e-9)
    return TargetRun(records, failures, wall, t0, sum(run.num_unsent for run in runs),
                     dict(sorted(errors.items())))


def send_error_summary(errors: Sequence[float]) -> dict[str, Any]:
    """p50 / p99 / max of send errors in seconds (nearest-rank p99), or {} for none."""
    if not errors:
        return {}
    ordered = sorted(errors)
    n = len(ordered)
    return {"n": n, "p50": statistics.median(ordered),
            "p99": ordered[min(n - 1, int(0.99 * n))], "max": ordered[-1]}


@dataclass(frozen=True)
class _WorkerSpec:
    index: int
    core: int
    target: TargetSection
    tokenizer: str | None
    requests: list[Request]
    max_concurrency: int | None
    api_key: str | None
    submit_until_s: float | None = None  # measure.duration_s, on the common clock


def _load_tokenizer(name: str | None) -> Any:
    if name is None:
        return None
    from infbench.model.tokenizer import Tokenizer

    kind, path = tokenizer_source(name)  # checked when the scenario loaded
    return Tokenizer.from_hf_dir(path) if kind == "hf" else Tokenizer.from_gguf(path)


def _worker_main(spec: _WorkerSpec, conn: Connection) -> None:
    """One worker: pin, load, report ready; then one pass per ("run", t0) until "stop"."""
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {spec.core})
        plan = ClientPlan(spec.target, _load_tokenizer(spec.tokenizer), spec.max_concurrency)
        pool = spec.max_concurrency or max(1, sum(r.n for r in spec.requests))

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            async with open_session(spec.target, pool) as session:
                conn.send(("ready", time.perf_counter()))
                while True:
                    message = await loop.run_in_executor(None, conn.recv)
                    if message[0] != "run":
                        return
                    run = await run_requests(plan, spec.requests, session=session,
                                             api_key=spec.api_key, t0=message[1],
                                             submit_until_s=spec.submit_until_s)
                    conn.send(("done", run))

        asyncio.run(serve())
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException as exc:  # noqa: BLE001 (reported to the parent as one line)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        try:
            conn.send(("error", last))
        except OSError:
            pass


class WorkerPool:
    """N client processes, started on enter, stopped on exit; `run()` is one pass."""

    start_method = "spawn"

    def __init__(self, target: TargetSection, requests: Sequence[Request],
                 max_concurrency: int | None, api_key: str | None = None,
                 num_workers: int | None = None, submit_until_s: float | None = None
                 ) -> None:
        self.num_workers = num_workers or target.workers
        self.shares = worker_shares(requests, self.num_workers)
        self.caps = worker_caps(max_concurrency, self.num_workers)
        self.cores = worker_cores(self.num_workers)
        self.worker_of = {r.request_id: i for i, share in enumerate(self.shares)
                          for r in share}
        self._specs = [_WorkerSpec(i, self.cores[i], target, target.tokenizer, share,
                                   self.caps[i], api_key, submit_until_s)
                       for i, share in enumerate(self.shares)]
        self.nodes = [socket.gethostname()] * self.num_workers
        self._procs: list[Any] = []
        self._conns: list[Connection] = []

    def __enter__(self) -> WorkerPool:
        ctx = multiprocessing.get_context("spawn")
        try:
            for spec in self._specs:
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(spec, child), daemon=True,
                                   name=f"infbench-client-{spec.index}")
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
            for i in range(self.num_workers):
                self._expect(i, "ready", READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (for CPU accounting)."""
        return [int(p.pid) for p in self._procs if p.pid is not None]

    def _expect(self, i: int, kind: str, timeout_s: float | None) -> Any:
        conn = self._conns[i]
        if not conn.poll(timeout_s):
            raise UserError(f"client worker {i}: no answer within {timeout_s:g} s")
        try:
            message = conn.recv()
        except (EOFError, OSError):
            code = self._procs[i].exitcode
            raise UserError(f"client worker {i} exited (code {code}) before it answered"
                            ) from None
        if message[0] == "error":
            raise UserError(f"client worker {i}: {message[1]}")
        if message[0] != kind:
            raise UserError(f"client worker {i}: answered {message[0]!r}, not {kind!r}")
        return message[1]

    def run(self, lead_s: float = START_LEAD_S) -> TargetRun:
        """One pass over the whole workload: every worker starts at the same t0."""
        t0 = time.perf_counter() + lead_s
        for conn in self._conns:
            conn.send(("run", t0))
        runs = [self._expect(i, "done", None) for i in range(self.num_workers)]
        return merge_runs(runs, t0)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop", None))
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


def measure_with_workers(target: TargetSection, requests: Sequence[Request],
                         cap: int | None, api_key: str | None, warmup: int, repeats: int,
                         phase: Callable[[str], None],
                         check: Callable[[TargetRun, str], None],
                         pool_type: type[WorkerPool] | None = None,
                         submit_until_s: float | None = None,
                         scraper: MetricsScraper | None = None,
                         ) -> tuple[Any, list[TargetRun], dict[str, Any]]:
    """client.point's passes with `target.workers` processes: (the server's /models, the
    repeats' merged runs, the workers' telemetry with `worker_of`: request id -> worker).
    `scraper` scrapes the server's /metrics over the repeats, from a thread of this
    process while the workers stream."""
    async def models() -> Any:
        async with open_session(target, 1) as session:
            return await fetch_models(session, target, api_key)

    server_models = asyncio.run(models())
    phase(f"starting {target.workers} client workers")
    passes: list[TargetRun] = []
    with (pool_type or WorkerPool)(target, requests, cap, api_key,
                                   submit_until_s=submit_until_s) as pool:
        for i in range(warmup):
            phase(f"warm-up {i + 1}/{warmup}")
            check(pool.run(), "warm-up")
        with contextlib.nullcontext() if scraper is None else ThreadedScraper(scraper):
            for i in range(repeats):
                phase(f"repeat {i + 1}/{repeats}")
                run = pool.run()
                check(run, f"repeat {i + 1}")
                passes.append(run)
        telemetry = {"count": pool.num_workers, "assignment": ASSIGNMENT,
                     "cores": pool.cores, "max_concurrency": pool.caps,
                     "requests": [len(share) for share in pool.shares],
                     "start_method": pool.start_method, "nodes": pool.nodes}
        worker_of = pool.worker_of
    telemetry["worker_of"] = worker_of
    return server_models, passes, telemetry
