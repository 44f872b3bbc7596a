"""Kernel backend switch: `engine.backend: auto | triton | torch`.

auto picks the Triton kernels on CUDA and their torch references elsewhere.
Triton on a CPU works only through the interpreter (TRITON_INTERPRET=1, which
Triton reads when the kernel modules are first imported); it is for tests, not
for speed.  Both backends expose the same functions, so the model and the runner
never branch on the backend.
"""

from __future__ import annotations

import os

import torch

from infbench.core.errors import ConfigError
from infbench.model.ops import Ops


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            "engine.backend: 'triton' on a CPU needs the Triton interpreter "
            "(set TRITON_INTERPRET=1; it is slow and meant for tests); allowed on CPU: auto, torch"
        )
    return name


def get_ops(name: str, device: torch.device) -> Ops:
    """The kernel functions of backend `name` (auto | triton | torch) for `device`."""
    return Ops(resolve_backend(name, device))
