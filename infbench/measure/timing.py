"""One timer for every measurement: CUDA events on a GPU, perf_counter on a CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def time_op(fn: Callable[[], object], device: str, repeats: int, warmup: int,
            inner: int = 1) -> list[float]:
    """Seconds per call of `fn`, one entry per repeat (each repeat runs it `inner` times)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / inner)  # elapsed_time is in ms
        return times
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return times
