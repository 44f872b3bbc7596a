"""Kernel backend switch: `engine.backend: auto | triton | cpu | torch`.

auto picks the Triton kernels on CUDA, and on a CPU the C++ kernels of
`kernels/csrc` (`cpu`: built with -march=native the first time this machine runs
them) when they build, else their torch references (`torch`).  Triton on a CPU works
only through the interpreter (TRITON_INTERPRET=1, which Triton reads when the kernel
modules are first imported); it is for tests, not for speed.  Every backend exposes
the same functions, so the model and the runner never branch on the backend.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

import torch

from infbench.core.errors import ConfigError
from infbench.model.ops import Ops


def cpu_kernels() -> tuple[bool, str]:
    """(True, "") when the C++ CPU kernels load here, else (False, why); built on first use."""
    from kernels import cpu_ops

    reason = cpu_ops.disabled_reason()
    return (False, reason) if reason else _build_cpu_kernels()


@functools.cache
def _build_cpu_kernels() -> tuple[bool, str]:
    from kernels import cpu_ops

    if not cpu_ops.is_built():
        print("note: building infbench's C++ CPU kernels for this CPU (once per machine and "
              "kernel version, about a minute)", file=sys.stderr, flush=True)
    return cpu_ops.available()


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        if device.type == "cuda":
            return "triton"
        ok, why = cpu_kernels()
        if not ok:
            warnings.warn(f"engine.backend auto: running the torch reference kernels on the CPU "
                          f"because the C++ CPU kernels are unavailable: {why}", stacklevel=2)
            return "torch"
        return "cpu"
    if name == "cpu":
        if device.type != "cpu":
            raise ConfigError(f"engine.backend: 'cpu' runs on the CPU, not {device.type}; "
                              "allowed there: auto, triton, torch")
        ok, why = cpu_kernels()
        if not ok:
            raise ConfigError(f"engine.backend: 'cpu' is unavailable here: {why}; "
                              "allowed: auto, torch")
        return name
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            "engine.backend: 'triton' on a CPU needs the Triton interpreter "
            "(set TRITON_INTERPRET=1; it is slow and meant for tests); allowed on CPU: "
            "auto, cpu, torch"
        )
    return name


def get_ops(name: str, device: torch.device) -> Ops:
    """The kernel functions of backend `name` (auto | triton | cpu | torch) for `device`."""
    return Ops(resolve_backend(name, device))
