"""The size flags of `infbench serve` checked against this machine before any work.

A count above the sanity bound (MAX_BATCH, 2**24), a KV budget in bytes above the memory
the device has free, a fixed KV pool (`--num-kv-blocks`) that would not fit, more threads
than CPUs, more connections than the process may open files, or request bodies in flight
larger than the memory free: each is one `error:` line (exit 2) at start, instead of a
server that allocates for minutes and never gets ready.
"""

from __future__ import annotations

import os

from infbench.core.config import MAX_BATCH
from infbench.core.errors import UserError
from infbench.serve.limits import ServerLimits

RESERVED_FILES = 64  # descriptors kept for the model files, logs, the engine and replicas
MAX_SHUTDOWN_S = 24 * 3600.0
GIB = 1 << 30


def num_cpus() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE (a large number where there is none)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1 << 16
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def default_max_connections() -> int:
    return max(1, min(1024, open_files_limit() - RESERVED_FILES))


def check_counts(**flags: int | None) -> None:
    """Each count flag (name with underscores) at most MAX_BATCH."""
    for name, value in flags.items():
        if value is not None and value > MAX_BATCH:
            raise UserError(f"--{name.replace('_', '-')} {value}: at most {MAX_BATCH} (2**24)")


def check_threads(value: int | None, flag: str) -> None:
    cpus = num_cpus()
    if value is not None and value > cpus:
        raise UserError(f"{flag} {value}: this machine gives the process {cpus} CPUs")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def check_kv_memory(value: float | None, available: int, where: str, flag: str) -> None:
    """A KV budget in bytes (> 1) must not exceed the memory `where` has free; a fraction
    (<= 1) is of the free memory, so it always does."""
    if value is not None and value > 1 and value > available:
        raise UserError(f"{flag} {value:g}: more bytes than {where} has free "
                        f"({_gib(available)}); give a fraction (<= 1) or fewer bytes")


def check_pool_bytes(num_blocks: int, pool_bytes: int, available: int, where: str) -> None:
    """A fixed KV pool must fit the memory free after the weights are loaded."""
    if pool_bytes > available:
        raise UserError(f"--num-kv-blocks {num_blocks}: the KV pool would take "
                        f"{_gib(pool_bytes)}, more than {where} has free "
                        f"({_gib(available)})")


def server_limits(max_connections: int | None, max_request_bytes: int,
                  available: int) -> ServerLimits:
    """The HTTP limits from the flags, checked against file and memory limits."""
    files = open_files_limit()
    if max_connections is None:
        max_connections = default_max_connections()
    elif max_connections > files - RESERVED_FILES:
        raise UserError(f"--max-connections {max_connections}: the process may open "
                        f"{files} files (ulimit -n), {RESERVED_FILES} of them kept for "
                        f"the server; at most {max(1, files - RESERVED_FILES)}")
    in_flight = 4 * max_request_bytes  # four of the largest bodies read at once
    if in_flight > available // 2:
        raise UserError(f"--max-request-bytes {max_request_bytes}: four such bodies in flight "
                        f"({_gib(in_flight)}) would take over half the free memory "
                        f"({_gib(available)})")
    return ServerLimits(max_body_bytes=max_request_bytes, max_body_bytes_in_flight=in_flight,
                        max_connections=max_connections)


def check_shutdown_timeout(value: float) -> None:
    if value > MAX_SHUTDOWN_S:
        raise UserError(f"--shutdown-timeout {value:g}: at most {MAX_SHUTDOWN_S:g} s (a day)")
