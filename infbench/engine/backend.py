"""Kernel backend switch: `engine.backend: auto | triton | torch`.

auto picks the Triton kernels on CUDA and their torch references elsewhere.
Triton on a CPU works only through the interpreter (TRITON_INTERPRET=1, which
Triton reads when the kernel modules are first imported); it is for tests, not
for speed.  Both backends expose the same functions, so the model and the runner
never branch on the backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from infbench.core.errors import ConfigError


@dataclass(frozen=True)
class Ops:
    """The hot-path operations, bound to one backend."""

    name: str
    store_kv: Callable[..., Any]
    decode_attention: Callable[..., Any]
    prefill_attention: Callable[..., Any]
    mla_decode_attention: Callable[..., Any]
    rmsnorm: Callable[..., Any]
    rope: Callable[..., Any]
    silu_and_mul: Callable[..., Any]
    linear_attention_decode: Callable[..., Any]
    selective_state_update: Callable[..., Any]


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
    from kernels import (
        activation,
        linear_attention,
        mla_decode_attention,
        paged_decode_attention,
        prefill_attention,
        rmsnorm,
        rope,
        selective_scan,
        store_kv,
    )

    backend = resolve_backend(name, device)
    suffix = "" if backend == "triton" else "_ref"

    def pick(module: Any, fn: str) -> Callable[..., Any]:
        return getattr(module, fn + suffix)  # type: ignore[no-any-return]

    return Ops(
        name=backend,
        store_kv=pick(store_kv, "store_kv"),
        decode_attention=pick(paged_decode_attention, "paged_decode_attention"),
        prefill_attention=pick(prefill_attention, "prefill_attention"),
        mla_decode_attention=pick(mla_decode_attention, "mla_decode_attention"),
        rmsnorm=pick(rmsnorm, "rmsnorm"),
        rope=pick(rope, "rope"),
        silu_and_mul=pick(activation, "silu_and_mul"),
        linear_attention_decode=pick(linear_attention, "linear_attention_decode"),
        selective_state_update=pick(selective_scan, "selective_state_update"),
    )
