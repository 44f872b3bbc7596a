"""Build and load infbench's C++ CPU kernels (the `cpu` backend), once per machine.

The sources in `kernels/csrc/` are compiled with `-O3 -march=native -fopenmp` by
`torch.utils.cpp_extension` (g++ and ninja) the first time a process asks for them, into
a cache directory keyed by the sources, the compiler flags, the torch version and the
CPU's model and flags; later processes on the same machine load the built module in
milliseconds.  `-march=native` is why the key holds the CPU: the binary uses what this
CPU has (AVX-512 BF16 dot products, AVX-512F or AVX2 FMA lanes) and may not run on
another.

The cache directory is `$INFBENCH_CPU_KERNELS_DIR` when set, else
`~/.cache/infbench/cpu-kernels`.  `INFBENCH_CPU_KERNELS=0` disables the backend (the
engine then falls back to the torch references), which is how a test or a user compares
the two on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).resolve().parent / "csrc"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17")
LDFLAGS = ("-fopenmp",)
DISABLE_ENV = "INFBENCH_CPU_KERNELS"
DIR_ENV = "INFBENCH_CPU_KERNELS_DIR"


class CpuKernelsUnavailable(RuntimeError):
    """The C++ CPU kernels cannot be used here; the message says why in one line."""


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux /proc/cpuinfo, else platform)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    model = flags = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
        if model and flags:
            break
    return f"{model}|{flags}"


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp"))


@functools.cache
def build_key() -> str:
    """A short hash of everything the built module depends on (once per process: it reads
    every source and /proc/cpuinfo, and is_built, build_dir and module_name all ask)."""
    import torch

    digest = hashlib.sha256()
    for path in sources() + sorted(CSRC.glob("*.h")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    # The source and torch paths too: ninja's build file names them, so two checkouts or
    # two environments sharing one directory would rewrite it and rebuild each other's
    # module from scratch on every first load (a minute on 2 cores, seen mid-test).
    for part in (*CFLAGS, *LDFLAGS, torch.__version__, platform.python_version(),
                 _cpu_identity(), str(CSRC), str(Path(torch.__file__).resolve().parent)):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get(DIR_ENV) or Path.home() / ".cache" / "infbench" / "cpu-kernels"
    return Path(root) / build_key()


def module_name() -> str:
    return f"infbench_cpu_{build_key()}"


def is_built() -> bool:
    """True when this machine already has the module (loading it then takes no build)."""
    return any(build_dir().glob(f"{module_name()}*.so"))


def disabled_reason() -> str | None:
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{DISABLE_ENV}={os.environ[DISABLE_ENV]} disables them"
    return None


def load() -> ModuleType:
    """The compiled module (built on first use); CpuKernelsUnavailable says why not."""
    reason = disabled_reason()
    if reason:
        raise CpuKernelsUnavailable(reason)
    return _load()


def module() -> ModuleType:
    """The compiled module, for the `*_cpu` launchers to call on every kernel launch.

    `load()` without its INFBENCH_CPU_KERNELS check: reading an unset variable from
    os.environ costs about 2 us (a KeyError inside), more than a one-token norm takes, and
    the backend switch has already asked `load()` before any launcher runs.
    """
    return _load()


@functools.cache
def _load() -> ModuleType:
    try:
        from torch.utils.cpp_extension import load as load_extension
    except ImportError as exc:  # pragma: no cover - torch always ships it
        raise CpuKernelsUnavailable(f"torch.utils.cpp_extension is missing: {exc}") from exc
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory):
        try:
            return load_extension(
                name=module_name(),
                sources=[str(p) for p in sources()],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(directory),
                verbose=False,
            )
        except Exception as exc:  # a compiler error, no g++ or ninja: one line, then fall back
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CpuKernelsUnavailable(f"building the C++ CPU kernels failed: {first}") from exc


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold an flock on `directory/build.flock` while torch builds or loads the module.

    torch's own build lock is a plain file (`lock`) that a killed build leaves behind, and
    every later load then waits on it forever (seen: a test timed out mid-build and every
    process of every checkout hung).  The kernel releases an flock when its process dies, so
    whoever holds this one is the only builder, and a `lock` file found then is stale.
    """
    with open(directory / "build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def available() -> tuple[bool, str]:
    """(True, "") when the kernels load, else (False, why) in one line."""
    try:
        load()
    except CpuKernelsUnavailable as exc:
        return False, str(exc)
    return True, ""
