"""Device helpers: one resolver for `auto | cpu | cuda` and one free-memory probe.

torch is imported inside these functions on purpose (not to dodge a cycle): `core` is
imported by the analytic commands, which must start without loading torch, and
`resolve_device` answers `auto` without torch when torch is not loaded yet.  The
import-linter contract that keeps torch out of `core` names this module as its one
exception.
"""

from __future__ import annotations

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
