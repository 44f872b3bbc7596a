"""One timer for every measurement: CUDA events on a GPU, perf_counter on a CPU.

torch is imported only on the CUDA path, so CPU-only callers (kernel bench listing,
the host-loop benchmark) import this module without loading torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def time_op(fn: Callable[[], object], device: str, repeats: int, warmup: int,
            inner: int = 1) -> list[float]:
    """Seconds per call of `fn`, one entry per repeat (each repeat runs it `inner` times)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device == "cuda":
        import torch

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


def calls_per_sample(fn: Callable[[], object], target_s: float = 2e-3,
                     max_calls: int = 100) -> int:
    """How many calls of `fn` make one CPU timing sample last about `target_s` (timer
    resolution and loop overhead stay small next to it); calls `fn` once to find out."""
    start = time.perf_counter()
    fn()
    estimate = time.perf_counter() - start
    return max(1, min(max_calls, int(target_s / max(estimate, 1e-7))))
