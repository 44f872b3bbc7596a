"""`sim_fidelity --through serve`: one Poisson point through `infbench serve` and the client,
against its prediction with the server's overhead priced in.

For each point, `ServedPoint` starts `infbench serve --scenario` on the point's own
document (so the model, dtype, device and engine section, block size, max_num_seqs,
max_num_batched_tokens, prefix caching and threads, are the in-process point's) on a free
loopback port, and then:

1. warms it with the point's workload drawn at another seed (other prompts: the server keeps
   its prefix cache between requests, so a warm-up of the same prompts would serve the
   measured ones from the cache, which `Engine.run`'s cold start never does), all at once;
2. measures the request overhead: `PROBES` requests of `--prompt` random token ids and one
   output token, one at a time on the idle server, each the client's TTFT minus the engine
   steps' own seconds over it (`infbench:engine_step_seconds_total` of /metrics, read
   before and after): the HTTP request and its parsing, the hand-offs between the event
   loop and the engine thread, the SSE chunk and the client's read.  The median is the
   point's `target.request_overhead_s`, which the prediction adds to every request's token
   times (measure/simulation.py);
3. runs the point as a client point (`target:` with token prompts and `return_token_ids`,
   so lengths and per-token times are exact; `ignore_eos` is the workload's default) with
   `client.point.run_target_point`, which records the measured metrics beside the
   prediction of the same requests, as `infbench run` does; the engine's steps over the
   point (their number and mean seconds, from /metrics) go into the row beside the
   simulation's number of steps;
4. stops the server with SIGTERM and requires a clean exit.

The per-token work of the server (detokenizing, the SSE chunks) runs on its event loop, not
on the engine thread, so it is not in a step's time: it shows as ITL jitter (and as
contention for the machine's cores), not as a priced term.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import yaml

from infbench.core.errors import UserError
from infbench.engine.request import Request, SamplingParams
from infbench.scenario.target import TargetSection

PROBES = 5  # idle requests whose median overhead is the point's term
STEPS = "infbench:engine_steps_total"
STEP_SECONDS = "infbench:engine_step_seconds_total"
START_TIMEOUT_S = 600.0  # the first start on a machine may build the C++ kernels
STOP_TIMEOUT_S = 60.0
SETTLE_S = 0.05  # settled_counters: the gap between two equal reads


def counters(metrics_url: str) -> dict[str, float]:
    """The engine's step counters from the server's Prometheus text (one model: no labels
    to tell apart)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in (STEPS, STEP_SECONDS):
            out[name] = float(line.rsplit(" ", 1)[1])
    if len(out) != 2:
        raise UserError(f"{metrics_url}: no {STEPS} / {STEP_SECONDS} (not infbench serve, or "
                        "one older than these counters)")
    return out


def settled_counters(metrics_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """`counters` once two reads SETTLE_S apart agree: a client's stream ends with its last
    token, and the server counts the step that produced it just after, so a read right
    after a request returns may still miss that step (it would then land in the next
    probe's difference)."""
    last = counters(metrics_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = counters(metrics_url)
        if now == last:
            return now
        last = now
    return last


class ServedPoint:
    """`infbench serve --scenario` of one point's document until the context ends."""

    def __init__(self, doc: dict[str, Any], name: str, max_model_len: int) -> None:
        from infbench.serve.replicas import free_port

        self.port = free_port()
        self.name = name
        self._dir = tempfile.TemporaryDirectory(prefix="infbench-fidelity-")
        self._scenario = Path(self._dir.name) / "point.yaml"
        self._scenario.write_text(yaml.safe_dump(doc, sort_keys=False))
        self._log = Path(self._dir.name) / "serve.log"
        self._max_model_len = max_model_len
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def target(self, request_overhead_s: float = 0.0) -> dict[str, Any]:
        """The client point's `target:` section for this server."""
        return {"kind": "openai", "base_url": self.base_url, "model": self.name,
                "return_token_ids": True, "metrics": False,
                "request_overhead_s": request_overhead_s}

    def _log_tail(self) -> str:
        text = self._log.read_text(errors="replace") if self._log.exists() else ""
        return " ".join(text.split())[-300:] or "(no output)"

    def __enter__(self) -> ServedPoint:
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infbench.cli", "serve", "--scenario",
                 str(self._scenario), "--served-model-name", self.name,
                 "--max-model-len", str(self._max_model_len), "--host", "127.0.0.1",
                 "--port", str(self.port), "--shutdown-timeout", "5"],
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                if self._proc.poll() is not None:
                    self._dir.cleanup()
                    raise UserError(f"infbench serve exited ({self._proc.returncode}): "
                                    f"{self._log_tail()}") from None
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise UserError(f"infbench serve did not become healthy within {START_TIMEOUT_S:g} s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """SIGTERM, then wait; an unclean exit is an error unless one is propagating."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        tail = self._log_tail()
        self._dir.cleanup()
        if code != 0 and kind is None:
            raise UserError(f"infbench serve did not stop cleanly (exit {code}): {tail}")


def client_pass(target: dict[str, Any], requests: list[Request]) -> Any:
    """The requests through the server once (client.openai_target), every one in flight at
    once or at its arrival: the TargetRun; a failed request is an error."""
    from infbench.client.openai_target import ClientPlan, open_session, run_requests

    section = TargetSection.model_validate(target)

    async def go() -> Any:
        async with open_session(section, len(requests)) as session:
            return await run_requests(ClientPlan(section), requests, session=session)

    run = asyncio.run(go())
    if run.failures:
        first = run.failures[0]
        raise UserError(f"{section.base_url}: {len(run.failures)} request(s) failed; first "
                        f"({first.request_id}, {first.reason}): {first.message}")
    return run


def warm_up(server: ServedPoint, point: Any) -> None:
    """The point's workload at another seed, every request at once (module docstring, 1)."""
    from infbench.client.point import point_requests

    other = replace(point, workload=replace(point.workload, seed=point.workload.seed + 1))
    drawn = point_requests(other, None).requests
    client_pass(server.target(), [replace(r, arrival_s=0.0) for r in drawn])


def request_overhead(server: ServedPoint, prompt_len: int, vocab_size: int,
                     seed: int) -> dict[str, Any]:
    """The idle probes (module docstring, 2): each one's client TTFT, engine seconds and
    their difference, and the median difference (>= 0) as `request_overhead_s`."""
    rng = np.random.default_rng(seed)
    probes = []
    for i in range(PROBES):
        ids = tuple(int(t) for t in rng.integers(10, vocab_size, size=prompt_len))
        before = settled_counters(server.metrics_url)
        run = client_pass(server.target(), [Request(
            f"probe{i}", ids, SamplingParams(max_tokens=1, ignore_eos=True))])
        after = settled_counters(server.metrics_url)
        rec = run.records[0]
        ttft = rec.token_times_s[0] - rec.arrival_s
        engine_s = after[STEP_SECONDS] - before[STEP_SECONDS]
        probes.append({"ttft_s": ttft, "engine_s": engine_s,
                       "steps": int(after[STEPS] - before[STEPS]),
                       "overhead_s": ttft - engine_s})
    median = statistics.median(p["overhead_s"] for p in probes)
    return {"request_overhead_s": max(0.0, median), "probes": probes}


def max_model_len(points: list[Any], prompt_len: int) -> int:
    """The longest request the server will see: the points' (drawn as the client draws
    them) and a probe's."""
    from infbench.client.point import point_requests

    longest = max(len(r.prompt_ids) + r.sampling.max_tokens
                  for p in points for r in point_requests(p, None).requests)
    return max(longest, prompt_len + 1)


def run_served(doc: dict[str, Any], point: Any, model: str, prompt_len: int,
               log: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One point through `infbench serve` (module docstring): its result (a client point's,
    the prediction with the overhead in it) and what the server showed of itself."""
    from infbench.client.point import run_target_point
    from infbench.scenario.schema import scenario_from_document

    warm = replace(point, workload=replace(point.workload, seed=point.workload.seed + 1))
    name = f"fidelity-{model}"
    with ServedPoint(doc, name, max_model_len([point, warm], prompt_len)) as server:
        warm_up(server, point)
        overhead = request_overhead(server, prompt_len, point.model_config().vocab_size,
                                    point.workload.seed + 2)
        log(f"  request overhead {overhead['request_overhead_s'] * 1e3:.2f} ms (median of "
            f"{PROBES} idle probes)")
        # warmed with other prompts above: a warm-up pass of these would hit the prefix cache
        served_doc = {**doc, "target": server.target(overhead["request_overhead_s"]),
                      "measure": {**doc["measure"], "warmup": 0, "repeats": 1}}
        served = scenario_from_document(served_doc, "sim_fidelity").points()[0]
        before = settled_counters(server.metrics_url)
        result = run_target_point(served)
        after = settled_counters(server.metrics_url)
    steps = int(after[STEPS] - before[STEPS])
    seconds = after[STEP_SECONDS] - before[STEP_SECONDS]
    predicted = (result.get("prediction") or {}).get("metrics") or {}
    return result, {**overhead, "server_steps": steps,
                    "server_step_s_mean": seconds / steps if steps else None,
                    "predicted_steps": predicted.get("num_steps")}
