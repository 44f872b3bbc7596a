"""`infbench run --ray ADDRESS`: client workers as Ray actors, engine points on Ray nodes.

Ray (`pip install 'infbench[ray]'`) is an optional extra; nothing here imports it until a
run asks for it, and without it `--ray` is one `error:` line.  `connect(address)`:

- `local` starts a private cluster on loopback for the run (`ray.init(address="local")`,
  node address 127.0.0.1, no dashboard, usage stats off) and stops it at the end;
- a process already connected to a cluster (`ray.init` called before: a notebook, a test)
  uses that one whatever the address, and leaves it running;
- anything else is Ray's own address (`auto`: the cluster this machine joined with
  `ray start`; `HOST:PORT`; `ray://HOST:10001`), connected to and left running.  (`auto`
  keeps Ray's meaning rather than starting a cluster, so a Ray user's habit holds.)

Two things use the cluster:

1. **Client workers** (`RayWorkerPool`): a target point's `target.workers` clients become
   actors (`num_cpus=0`, scheduling strategy SPREAD, so they land on as many nodes as
   there are), fed the same round-robin shares and split cap as `client/workers.py`'s
   processes, each pinned to core `index` modulo its node's cores, with one event loop and
   connection pool for the whole point.  The common start is a `time.time()` epoch, turned
   into each actor's own `perf_counter` reading (`t0 = epoch - (time.time() -
   perf_counter())`), so every record is relative to one instant: exact on one host,
   within the hosts' clock skew (NTP: typically well under a millisecond on a LAN) across
   hosts.  The telemetry names each actor's node.
2. **Engine points** (`--ray-engine-points`, `EngineDispatch`): each engine point of the
   sweep runs as a Ray task (`measure.bench.run_point` on that node, its own model cache),
   at most one point per node at a time, pinned with a node-affinity strategy; the
   cluster's GPU nodes (a task asks for one GPU, device cuda) when it has any, else all its
   nodes on the CPU.  The parent still walks the points in order and writes every result
   into the one run directory as it arrives (the later points keep running on the other
   nodes meanwhile), so `--resume`, the CSV and the gate work unchanged.  A target point
   is a barrier: no engine point runs while the client measures a server, so a cluster
   that includes this host does not disturb the client's timing.  A point's
   UserError on a node is the run's one-line error, as locally; the result's
   `env.ray_node` says where it ran.  The nodes need infbench importable (the same
   environment); the local cluster inherits this process's `PYTHONPATH`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from infbench.client.openai_target import ClientPlan, TargetRun, open_session, run_requests
from infbench.client.workers import WorkerPool, _load_tokenizer, _WorkerSpec, merge_runs
from infbench.core.errors import UserError
from infbench.scenario.point import ScenarioPoint

START_LEAD_S = 0.2  # a start sent through Ray reaches every actor well within this


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--ray: the ray package is not installed; install the extra: "
                        "pip install 'infbench[ray]'") from None
    return ray


class RayCluster:
    """One connection to a Ray cluster for a run (a context manager)."""

    def __init__(self, address: str) -> None:
        if not address.strip():
            raise UserError("--ray: give an address: local (a cluster on loopback for this "
                            "run), auto, HOST:PORT or ray://HOST:PORT")
        self.address = address
        self.ray = _ray()
        self._started = False
        self._handlers: dict[int, Any] = {}

    def __enter__(self) -> RayCluster:
        ray = self.ray
        if ray.is_initialized():  # a driver already connected (a notebook, a test): as is
            return self
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # ray.init installs its own SIGTERM handler in the driver; put back what was there
        # on exit, so a run (or a test process) is left as it was found
        self._handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            if self.address == "local":
                ray.init(address="local", include_dashboard=False,
                         _node_ip_address="127.0.0.1", logging_level=logging.WARNING,
                         log_to_driver=False, configure_logging=True)
            else:
                ray.init(address=self.address, logging_level=logging.WARNING,
                         log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            first = " ".join(str(exc).split())[:200]
            raise UserError(f"--ray {self.address}: cannot reach a Ray cluster: {first}"
                            ) from None
        self._started = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False
            for sig, handler in self._handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)

    def nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]


class _ClientActor:
    """One client worker on a Ray node: pinned, one loop and one pool for the point."""

    def __init__(self, spec: _WorkerSpec) -> None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        self.core = cores[spec.index % len(cores)]
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.core})
        self.spec = spec
        self.plan = ClientPlan(spec.target, _load_tokenizer(spec.tokenizer),
                               spec.max_concurrency)
        self.loop = asyncio.new_event_loop()
        pool = spec.max_concurrency or max(1, sum(r.n for r in spec.requests))

        async def session() -> Any:
            return open_session(spec.target, pool)

        self.session = self.loop.run_until_complete(session())

    def where(self) -> tuple[str, int]:
        import socket

        return socket.gethostname(), self.core

    def run(self, epoch: float) -> TargetRun:
        t0 = epoch - (time.time() - time.perf_counter())  # the epoch on this clock
        return self.loop.run_until_complete(run_requests(
            self.plan, self.spec.requests, session=self.session, api_key=self.spec.api_key,
            t0=t0, submit_until_s=self.spec.submit_until_s))

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.close()


class RayWorkerPool(WorkerPool):
    """`WorkerPool`'s shares and caps, its workers Ray actors instead of processes."""

    start_method = "ray actors"

    def __enter__(self) -> RayWorkerPool:
        ray = _ray()
        actor = ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(_ClientActor)
        self._actors = [actor.remote(spec) for spec in self._specs]
        try:
            where = ray.get([a.where.remote() for a in self._actors])
        except ray.exceptions.RayError as exc:
            self.close()
            raise UserError(f"a client actor did not start: {_cause(exc)}") from None
        self.nodes = [host for host, _ in where]
        self.cores = [core for _, core in where]
        return self

    def run(self, lead_s: float = START_LEAD_S) -> TargetRun:
        ray = _ray()
        epoch = time.time() + lead_s
        try:
            runs = ray.get([a.run.remote(epoch) for a in self._actors])
        except ray.exceptions.RayError as exc:
            raise UserError(f"a client actor failed: {_cause(exc)}") from None
        merged = merge_runs(runs, time.perf_counter() - (time.time() - epoch))
        return merged

    def close(self) -> None:
        ray = _ray()
        actors = getattr(self, "_actors", [])
        try:
            ray.get([a.close.remote() for a in actors], timeout=30)
        except ray.exceptions.RayError:
            pass
        for a in actors:
            ray.kill(a)
        self._actors = []


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    text = str(cause) if cause is not None else str(exc)
    return " ".join(text.split())[:300]


def _run_engine_point(point: ScenarioPoint, device: str | None) -> dict[str, Any]:
    """One engine point on a node (a Ray task)."""
    import socket

    from infbench.measure.bench import ModelCache, run_point

    result = run_point(point, cache=ModelCache(), device=device)
    result.setdefault("env", {})["ray_node"] = socket.gethostname()
    return result


class EngineDispatch:
    """Engine points sent to the cluster, one per node at a time; `measure(point)` (the
    signature of `run_point`) waits for that point's result while the others run."""

    def __init__(self, cluster: RayCluster, points: Sequence[ScenarioPoint],
                 device: str | None) -> None:
        ray = cluster.ray
        self.gpu, nodes = self.nodes_for(cluster, device)
        self.device = "cuda" if self.gpu else "cpu"
        self.free = deque(nodes)
        self.ray = ray
        self.remote = ray.remote(_run_engine_point)
        # every point of the run in its order: a target point is a barrier (no engine point
        # runs while the client measures a server here, so a cluster that includes this
        # host does not disturb the client's timing)
        self.pending = deque(points)
        self.order = {p.index: i for i, p in enumerate(points)}
        self.inflight: dict[int, tuple[Any, str]] = {}
        self._fill()

    @staticmethod
    def nodes_for(cluster: RayCluster, device: str | None) -> tuple[bool, list[str]]:
        """(GPU nodes?, the node ids engine points go to); a UserError when none fits."""
        nodes = cluster.nodes()
        gpu_nodes = [n for n in nodes if n.get("Resources", {}).get("GPU", 0) >= 1]
        if gpu_nodes and device == "cpu":
            gpu_nodes = []  # --device cpu: the points run on the nodes' CPUs
        if device == "cuda" and not gpu_nodes:
            raise UserError("--ray-engine-points: --device cuda, but the Ray cluster has no "
                            "node with a GPU; use --device cpu or a cluster with GPUs")
        chosen = [n["NodeID"] for n in (gpu_nodes or nodes)]
        if not chosen:
            raise UserError("--ray-engine-points: the Ray cluster has no live node")
        return bool(gpu_nodes), chosen

    @property
    def num_nodes(self) -> int:
        return len(self.free) + len(self.inflight)

    def _fill(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        while self.free and self.pending and self.pending[0].target is None:
            point = self.pending.popleft()
            node = self.free.popleft()
            ref = self.remote.options(
                num_cpus=0, num_gpus=1 if self.gpu else 0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(point, self.device)
            self.inflight[point.index] = (ref, node)

    def measure(self, point: ScenarioPoint, **_: Any) -> dict[str, Any]:
        here = self.order[point.index]
        while self.pending and self.pending[0].target is not None and \
                self.order[self.pending[0].index] < here:
            self.pending.popleft()  # a target point measured before this one: passed
        self._fill()
        if point.index not in self.inflight:  # points come in order: it is next
            raise ValueError(f"point {point.index} was not dispatched")
        ref, node = self.inflight.pop(point.index)
        try:
            result: dict[str, Any] = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            raise UserError(f"on Ray node {node[:12]}: {_cause(exc)}") from None
        finally:
            self.free.append(node)
            self._fill()
        return result

    def cancel(self) -> None:
        for ref, _ in self.inflight.values():
            self.ray.cancel(ref, force=True)
        self.inflight.clear()


def target_measure(run_target_point: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """`run_target_point` with its client workers as Ray actors."""
    def measure(point: ScenarioPoint, **kwargs: Any) -> dict[str, Any]:
        return run_target_point(point, pool_type=RayWorkerPool, **kwargs)

    return measure
