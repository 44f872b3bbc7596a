"""Device helpers: one resolver for `auto | cpu | cuda` and one free-memory probe.

torch is imported inside these functions on purpose (not to dodge a cycle): `core` is
imported by the analytic commands, which must start without loading torch, and
`resolve_device` answers `auto` without torch when torch is not loaded yet.  The
import-linter contract that keeps torch out of `core` names this module as its one
exception.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

from infbench.core.config import DEVICES  # the allowed devices, defined once
from infbench.core.errors import UserError

if TYPE_CHECKING:
    import torch


def guess_device(device: str) -> str:
    """auto -> cuda or cpu without importing torch (asks torch only if it is already loaded)."""
    if device != "auto":
        return device
    loaded = sys.modules.get("torch")
    if loaded is not None:
        return "cuda" if loaded.cuda.is_available() else "cpu"
    return "cuda" if os.path.exists("/proc/driver/nvidia/version") else "cpu"


def resolve_device(device: str, key: str = "device") -> str:
    """auto -> cuda when available, else cpu; `key` names the setting in errors."""
    if device not in DEVICES:
        raise UserError(f"{key}: unknown value {device!r}; allowed: {', '.join(DEVICES)}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{key}: 'cuda' requested but CUDA is not available here; "
                        "allowed: auto, cpu")
    return device


# CPU features that make bf16 matmuls native rather than emulated through fp32 conversion.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return frozenset()  # not Linux: no flags known, so auto stays on float32
    return frozenset()


# The flags that decide CPU kernel choices and speed, recorded with every CPU figure.
PERF_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
              "amx_int8", "asimd", "sve")


def perf_flags() -> list[str]:
    """The subset of PERF_FLAGS this CPU has, in PERF_FLAGS order."""
    flags = cpu_flags()
    return [f for f in PERF_FLAGS if f in flags]


def auto_dtype(device: str) -> tuple[str, str]:
    """What `dtype: auto` runs on `device` (cpu | cuda), and why, in a few words.

    bfloat16 on a GPU; on a CPU bfloat16 where it is native (AVX-512 BF16 or AMX: half
    the bytes of float32 per weight at full speed), float32 elsewhere (AVX2-only CPUs
    emulate bf16 matmuls, about 50x slower than fp32).
    """
    if device == "cuda":
        return "bfloat16", "GPU"
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in cpu_flags()]
    if native:
        return "bfloat16", f"CPU has native bf16: {', '.join(native)}"
    return "float32", "CPU has no avx512_bf16 or amx_bf16: bf16 matmuls would be emulated"


def available_memory_bytes(device: torch.device) -> int:
    """Memory the process could still take: free device memory, or MemAvailable on CPU."""
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass  # no /proc (not Linux): ask sysconf below
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
