"""`infbench serve --replicas N`: N engine processes behind one router.

Each replica is a whole `infbench serve` process (its own model copy, engine loop, KV pool
and torch thread pool, `--threads-per-replica` intra-op threads) on a private loopback
port; on Linux replica i is pinned to its own cores (os.sched_setaffinity) so two replicas
of one thread each on a 2-core machine do not migrate onto the same core.  The router is
an aiohttp app on the public port:

- POST /v1/completions and /v1/chat/completions go to one replica, chosen round-robin or by
  the fewest requests outstanding (`--router least_outstanding`, ties to the lowest index),
  and its answer (SSE stream or JSON, status included) is passed through as it arrives.
  A client that disconnects closes the upstream request, so the replica aborts it and frees
  its KV blocks, as with one server.
- GET /v1/models is replica 0's answer (every replica serves the same model);
  /health is 200 when every replica answers its own /health, else 503;
  /metrics is the router's counters (requests and outstanding per replica) followed by the
  replicas' own metrics, merged family by family with a `replica="i"` label on each sample.

Data parallelism with no shared state: the analytic expectation is throughput x N at
unchanged per-request latency while each replica has cores and memory bandwidth of its own
(`infbench predict --replicas`); the measurement is in docs/serving.md#replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from infbench.core.errors import UserError

ROUTERS = ("round_robin", "least_outstanding")
LOOPBACK = "127.0.0.1"
# Hop-by-hop and length headers are the router's own business on each side.
_SKIP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date",
                 "server", "content-encoding"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def core_sets(replicas: int, threads: int, cores: Sequence[int]) -> list[list[int]] | None:
    """Disjoint core lists of `threads` cores per replica, or None when there are too few
    cores to give every replica its own (then nothing is pinned)."""
    if replicas * threads > len(cores):
        return None
    return [list(cores[i * threads:(i + 1) * threads]) for i in range(replicas)]


@dataclass
class Replica:
    index: int
    port: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    cores: list[int] | None
    outstanding: int = 0
    routed: int = 0
    failed: int = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def last_log_line(self) -> str:
        self.log.flush()
        try:
            with open(self.log.name, "rb") as f:
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""


@dataclass
class ReplicaSet:
    """N `infbench serve` processes on loopback ports; `start` waits until each is healthy."""

    serve_args: list[str]  # the serve flags every replica gets (model, engine, limits)
    replicas: int
    threads: int
    # --num-threads to each replica (a --scenario replica takes its threads from
    # OMP_NUM_THREADS instead: serve refuses engine flags beside a scenario)
    pass_threads: bool = True
    replicas_: list[Replica] = field(default_factory=list)

    def start(self, timeout_s: float = 300.0, log_dir: str | None = None) -> list[Replica]:
        import tempfile

        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        pins = core_sets(self.replicas, self.threads, cores) if cores else None
        directory = log_dir or tempfile.mkdtemp(prefix="infbench-replicas-")
        for i in range(self.replicas):
            port = free_port()
            cmd = [sys.executable, "-m", "infbench.cli", "serve", *self.serve_args,
                   "--host", LOOPBACK, "--port", str(port)]
            if self.pass_threads:
                cmd += ["--num-threads", str(self.threads)]
            env = {**os.environ, "OMP_NUM_THREADS": str(self.threads),
                   "MKL_NUM_THREADS": str(self.threads)}
            pin = pins[i] if pins else None
            log = open(os.path.join(directory, f"replica-{i}.log"), "wb")  # noqa: SIM115
            preexec: Callable[[], None] | None = None
            if pin is not None:
                def preexec(cpus: list[int] = pin) -> None:
                    os.sched_setaffinity(0, cpus)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=preexec)
            self.replicas_.append(Replica(i, port, proc, log, pin))
        try:
            asyncio.run(self._wait_healthy(timeout_s))
        except BaseException:
            self.stop()
            raise
        return self.replicas_

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.replicas_)
        async with ClientSession(timeout=ClientTimeout(total=2)) as session:
            while pending:
                for rep in list(pending):
                    if not rep.alive():
                        raise UserError(f"--replicas: replica {rep.index} exited with code "
                                        f"{rep.process.returncode}: {rep.last_log_line()}")
                    with contextlib.suppress(ClientError, asyncio.TimeoutError, OSError):
                        async with session.get(rep.url + "/health") as resp:
                            if resp.status == 200:
                                pending.remove(rep)
                if pending and time.monotonic() > deadline:
                    raise UserError(f"--replicas: replica {pending[0].index} not healthy after "
                                    f"{timeout_s:.0f} s: {pending[0].last_log_line()}")
                if pending:
                    await asyncio.sleep(0.2)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every replica (each finishes or aborts its requests), then wait."""
        for rep in self.replicas_:
            if rep.alive():
                rep.process.terminate()
        deadline = time.monotonic() + timeout_s
        for rep in self.replicas_:
            try:
                rep.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rep.process.kill()
                rep.process.wait()
            rep.log.close()


class Router:
    """Picks a replica per request; counts what each was given."""

    def __init__(self, replicas: Sequence[Replica], policy: str) -> None:
        if policy not in ROUTERS:
            raise UserError(f"--router {policy!r}: allowed: {', '.join(ROUTERS)}")
        if not replicas:
            raise UserError("--replicas must be >= 1")
        self.replicas, self.policy = list(replicas), policy
        self._cycle = itertools.cycle(range(len(self.replicas)))

    def pick(self) -> Replica:
        if self.policy == "round_robin":
            return self.replicas[next(self._cycle)]
        return min(self.replicas, key=lambda r: (r.outstanding, r.index))

    def metrics_text(self) -> str:
        lines = ["# HELP infbench:router_requests_total Requests the router sent to each "
                 "replica.", "# TYPE infbench:router_requests_total counter"]
        lines += [f'infbench:router_requests_total{{replica="{r.index}"}} {r.routed}'
                  for r in self.replicas]
        lines += ["# HELP infbench:router_requests_outstanding Requests a replica is "
                  "answering now.", "# TYPE infbench:router_requests_outstanding gauge"]
        lines += [f'infbench:router_requests_outstanding{{replica="{r.index}"}} {r.outstanding}'
                  for r in self.replicas]
        lines += ["# HELP infbench:router_upstream_errors_total Requests a replica could not "
                  "be reached for.", "# TYPE infbench:router_upstream_errors_total counter"]
        lines += [f'infbench:router_upstream_errors_total{{replica="{r.index}"}} {r.failed}'
                  for r in self.replicas]
        return "\n".join(lines) + "\n"


def _with_replica(sample: str, replica: int) -> str:
    name_labels, _, value = sample.rpartition(" ")
    if "{" in name_labels:
        name, rest = name_labels.split("{", 1)
        sep = "" if rest.startswith("}") else ","
        return f'{name}{{replica="{replica}"{sep}{rest} {value}'
    return f'{name_labels}{{replica="{replica}"}} {value}'


def merge_metrics(texts: Sequence[str]) -> str:
    """The replicas' Prometheus texts as one: every sample gains a `replica="i"` label (i =
    its text's index), and each metric family stays one group (its HELP/TYPE lines once,
    then every replica's samples), as the text format requires."""
    families: dict[str, tuple[list[str], list[str]]] = {}  # name -> (comments, samples)
    for replica, text in enumerate(texts):
        current = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    comments, _ = families.setdefault(current, ([], []))
                    if line not in comments:
                        comments.append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            family = current if current and name.startswith(current) else name
            families.setdefault(family, ([], []))[1].append(_with_replica(line, replica))
    out = [line for comments, samples in families.values() for line in (*comments, *samples)]
    return "\n".join(out) + ("\n" if out else "")


def create_router_app(router: Router) -> web.Application:
    """The public aiohttp app in front of the replicas."""
    state: dict[str, Any] = {}

    async def on_startup(_app: web.Application) -> None:
        # One pooled session for all upstream calls; no total timeout: a long generation
        # streams for as long as it takes (the replica enforces its own limits).
        state["session"] = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None, sock_connect=10))

    async def on_cleanup(_app: web.Application) -> None:
        await state["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        rep = router.pick()
        rep.outstanding += 1
        rep.routed += 1
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        try:
            async with state["session"].post(rep.url + request.path, data=body,
                                             headers=headers) as upstream:
                out = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items()
                    if k.lower() not in _SKIP_HEADERS})
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)  # raises when the client went away
                await out.write_eof()
                return out
        except (ClientError, OSError) as exc:
            rep.failed += 1
            return web.json_response(
                {"error": {"message": f"replica {rep.index} unavailable: {exc}",
                           "type": "server_error", "param": None, "code": 502}}, status=502)
        finally:
            rep.outstanding -= 1

    async def models(_request: web.Request) -> web.Response:
        async with state["session"].get(router.replicas[0].url + "/v1/models") as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        for rep in router.replicas:
            try:
                async with state["session"].get(rep.url + "/health",
                                                timeout=ClientTimeout(total=5)) as resp:
                    if resp.status != 200:
                        raise ClientError(f"status {resp.status}")
            except (ClientError, OSError, asyncio.TimeoutError):
                return web.Response(status=503, text=f"replica {rep.index} unhealthy\n")
        return web.Response(text="ok\n")

    async def metrics(_request: web.Request) -> web.Response:
        texts = []
        for rep in router.replicas:
            try:
                async with state["session"].get(rep.url + "/metrics",
                                                timeout=ClientTimeout(total=5)) as resp:
                    texts.append(await resp.text())
            except (ClientError, OSError, asyncio.TimeoutError):
                texts.append("")  # an unreachable replica contributes no samples
        return web.Response(text=router.metrics_text() + merge_metrics(texts),
                            content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app
