"""`infbench serve --replicas N`: N engine processes for the router (router.py) to front.

Each replica is a whole `infbench serve` process (its own model copy, engine loop, KV pool
and torch thread pool, `--threads-per-replica` intra-op threads) on a private loopback
port; on Linux replica i is pinned to its own cores (os.sched_setaffinity) so two replicas
of one thread each on a 2-core machine do not migrate onto the same core.

The replicas answer only the router: each start draws a random secret, which every replica
gets as its API key (through INFBENCH_API_KEY, not its command line, which `ps` shows) with
`--protect-health-metrics`, and which the router sends.  They die with the router: each
runs in a session of its own (a Ctrl-C at the terminal reaches the router, which stops them
in order) with PR_SET_PDEATHSIG = SIGKILL on Linux, so a router killed with SIGKILL takes
them along.  Their logs go to one temporary directory, named at start and removed on a
clean stop (kept, and named again, when a replica failed).

Data parallelism with no shared state: the analytic expectation is throughput x N at
unchanged per-request latency while each replica has cores and memory bandwidth of its own
(`infbench predict --replicas`); the measurement is in docs/serving.md#replicas-measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from aiohttp import ClientError, ClientSession, ClientTimeout

from infbench.core.errors import UserError
from infbench.serve.security import API_KEY_ENV

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


@dataclass(eq=False)
class Replica:
    index: int
    port: int
    process: subprocess.Popen[bytes] | None
    log: IO[bytes] | None
    cores: list[int] | None
    outstanding: int = 0
    routed: int = 0
    failed: int = 0  # requests it could not be reached for or failed while answering
    healthy: bool = True  # in the router's rotation
    last_error: str = ""  # why it left the rotation

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def last_log_line(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        try:
            with open(self.log.name, "rb") as f:
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""


def _child_setup(parent: int, cpus: list[int] | None) -> None:
    """Run in each replica between fork and exec: die with the router, pin the cores."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the router died before the prctl took effect
            os._exit(1)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


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
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    log_dir: str = ""
    _owns_log_dir: bool = False

    def make_log_dir(self) -> str:
        """A new temporary directory for the logs, removed by a clean `stop`."""
        self.log_dir = tempfile.mkdtemp(prefix="infbench-replicas-")
        self._owns_log_dir = True
        return self.log_dir

    def start(self, timeout_s: float = 300.0, log_dir: str | None = None) -> list[Replica]:
        """Start the replicas, logging into `log_dir` (kept: the caller's) or into
        `make_log_dir()`'s directory; wait until every one answers /health."""
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        pins = core_sets(self.replicas, self.threads, cores) if cores else None
        if log_dir is None and not self.log_dir:
            self.make_log_dir()
        elif log_dir is not None and log_dir != self.log_dir:
            self.log_dir, self._owns_log_dir = log_dir, False
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads),
               "MKL_NUM_THREADS": str(self.threads), API_KEY_ENV: self.secret}
        parent = os.getpid()
        for i in range(self.replicas):
            port = free_port()
            cmd = [sys.executable, "-m", "infbench.cli", "serve", *self.serve_args,
                   "--host", LOOPBACK, "--port", str(port), "--protect-health-metrics"]
            if self.pass_threads:
                cmd += ["--num-threads", str(self.threads)]
            pin = pins[i] if pins else None
            log = open(os.path.join(self.log_dir, f"replica-{i}.log"), "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
                preexec_fn=lambda pin=pin: _child_setup(parent, pin))  # type: ignore[misc]
            self.replicas_.append(Replica(i, port, proc, log, pin))
        try:
            asyncio.run(self._wait_healthy(timeout_s))
        except BaseException:
            self.stop(timeout_s=10, keep_logs=True)  # the error names the directory
            raise
        return self.replicas_

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.replicas_)
        headers = {"Authorization": f"Bearer {self.secret}"}
        async with ClientSession(timeout=ClientTimeout(total=2)) as session:
            while pending:
                for rep in list(pending):
                    if not rep.alive():
                        code = rep.process.returncode if rep.process else None
                        raise UserError(f"--replicas: replica {rep.index} exited with code "
                                        f"{code}: {rep.last_log_line()} (logs in "
                                        f"{self.log_dir})")
                    with contextlib.suppress(ClientError, asyncio.TimeoutError, OSError):
                        async with session.get(rep.url + "/health", headers=headers) as resp:
                            if resp.status == 200:
                                pending.remove(rep)
                if pending and time.monotonic() > deadline:
                    raise UserError(f"--replicas: replica {pending[0].index} not healthy after "
                                    f"{timeout_s:.0f} s: {pending[0].last_log_line()} (logs in "
                                    f"{self.log_dir})")
                if pending:
                    await asyncio.sleep(0.2)

    def terminate(self) -> None:
        """SIGTERM every replica: each finishes its requests up to its --shutdown-timeout."""
        for rep in self.replicas_:
            if rep.alive():
                assert rep.process is not None
                rep.process.terminate()

    def stop(self, timeout_s: float = 30.0, keep_logs: bool = False) -> bool:
        """Terminate, wait (SIGKILL after `timeout_s`), close the logs; remove the log
        directory when every replica exited cleanly.  Returns whether they all did."""
        self.terminate()
        deadline = time.monotonic() + timeout_s
        clean = True
        for rep in self.replicas_:
            assert rep.process is not None
            try:
                code = rep.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rep.process.kill()
                code = rep.process.wait()
            clean = clean and code in (0, -signal.SIGTERM)
            if rep.log is not None:
                rep.log.close()
        if clean and not keep_logs and self._owns_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return clean
