"""Small helpers shared by the kernel launchers (no kernels here)."""

from __future__ import annotations

import functools
import os

import torch


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1): Triton tile sizes must be powers of two."""
    return 1 << max(0, (int(n) - 1).bit_length())


def is_compiled(t: torch.Tensor) -> bool:
    """True when the launch will compile for a GPU, False under TRITON_INTERPRET=1 on CPU."""
    return t.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1"


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 products for float32 tensors (no silent TF32)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors on a GPU, cores on a CPU: sizes grids and split-K."""
    if device.type == "cuda":
        return _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return os.cpu_count() or 1
