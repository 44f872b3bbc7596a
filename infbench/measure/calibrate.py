"""Measure this machine's roofline: read/copy bandwidth, GEMV bandwidth, GEMM FLOP/s.

`infbench calibrate` calls `calibrate()` and `save_profile()` so that scenarios can
say `hardware: local`.  Every figure is a round of timed repeats after warm-up (on CUDA
timed with CUDA events, on CPU with `time.perf_counter`) and its value is the best repeat,
the least disturbed on a shared machine; a round whose repeats spread too far is measured
again, and the profile is checked for figures that contradict each other before it is
saved (`hardware.checks`: refused, or saved with its flags).

- read bandwidth: `x.sum()` over a buffer far larger than the last-level cache.
  This is the profile's `bandwidth`, because decode is a read-dominated stream of
  weights and KV.
- copy bandwidth: `dst.copy_(src)`, counted as 2x the buffer (read + write).
- GEMV bandwidth: a weights-like matrix times a vector (what a decode step does to
  each linear layer); usually below the read figure, reported in `extra`.
- GEMM FLOP/s per dtype: square matmuls at a few sizes, the best size wins.  Sizes
  that would take too long (bf16 on a CPU is emulated, ~50x slower) are skipped.

`measure_reference_bandwidth()` is a short read probe a run can take next to its
measurement, so a CI gate can compare tokens/s per GB/s on a noisy shared machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from infbench.core.errors import UserError
from infbench.core.io import write_json_atomic
from infbench.hardware.checks import (
    MAX_ROUNDS,
    SPREAD_LIMIT,
    Figure,
    check_profile,
    measure_figure,
)
from infbench.hardware.machine import this_machine
from infbench.hardware.spec import HardwareSpec, profile_path
from infbench.measure.timing import time_op
from infbench.model.dtypes import TORCH_DTYPES


@dataclass(frozen=True)
class CalibrationPlan:
    """Sizes and repeat counts for one calibration (quick mode keeps tests short)."""

    buffer_bytes: int  # read / copy buffer, far above the LLC outside quick mode
    gemv_shape: tuple[int, int]  # (rows, cols) of the weights-like matrix
    gemm_sizes: tuple[int, ...]  # square n x n x n matmuls
    repeats: int
    warmup: int
    max_single_s: float  # skip larger GEMMs once one run takes longer than this


_MB = 1 << 20
PLANS: dict[tuple[str, bool], CalibrationPlan] = {
    ("cpu", False): CalibrationPlan(512 * _MB, (8192, 8192), (512, 1024, 2048), 10, 2, 2.0),
    ("cpu", True): CalibrationPlan(64 * _MB, (2048, 4096), (128, 256, 512), 3, 1, 0.1),
    ("cuda", False): CalibrationPlan(2048 * _MB, (16384, 16384), (2048, 4096, 8192), 20, 3, 2.0),
    ("cuda", True): CalibrationPlan(256 * _MB, (8192, 8192), (1024, 2048, 4096), 5, 2, 0.5),
}


def resolve_calibration_device(device: str) -> str:
    from infbench.core.device import resolve_device

    return resolve_device(device, "--device")


def _inner(device: str) -> int:
    # GPU kernels take microseconds to milliseconds: batch launches between events.
    return 5 if device == "cuda" else 1


def _rates(work: float, fn: Callable[[], object], device: str, repeats: int,
           warmup: int) -> Callable[[], list[float]]:
    """One round of `repeats` timings of `fn` as rates (`work` per second)."""
    return lambda: [work / t for t in time_op(fn, device, repeats, warmup, _inner(device))]


def read_bandwidth(device: str, nbytes: int, repeats: int, warmup: int) -> Figure:
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # touch every page
    return measure_figure(_rates(x.numel() * 4, lambda: x.sum(), device, repeats, warmup))


def copy_bandwidth(device: str, nbytes: int, repeats: int, warmup: int) -> Figure:
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    # read src + write dst
    return measure_figure(_rates(2 * src.numel() * 4, lambda: dst.copy_(src), device, repeats,
                                 warmup))


def gemv_bandwidth(device: str, shape: tuple[int, int], dtype: torch.dtype, repeats: int,
                   warmup: int) -> Figure:
    rows, cols = shape
    w = torch.randn(rows, cols, dtype=dtype, device=device)  # (rows, cols), like a Linear weight
    v = torch.randn(cols, dtype=dtype, device=device)
    nbytes = (w.numel() + v.numel() + rows) * w.element_size()
    return measure_figure(_rates(nbytes, lambda: torch.mv(w, v), device, repeats, warmup))


def gemm_flops(device: str, dtype: torch.dtype, sizes: tuple[int, ...], repeats: int,
               warmup: int, max_single_s: float) -> dict[int, Figure]:
    """FLOP/s per square size; stops growing once a single matmul exceeds `max_single_s`."""
    out: dict[int, Figure] = {}
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        def matmul(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return a @ b  # (n, n)

        first = time_op(matmul, device, 1, 1)[0]  # warm-up + a size probe
        if first > max_single_s:
            out[n] = Figure((2.0 * n**3 / first,), "best")
            break
        out[n] = measure_figure(_rates(2.0 * n**3, matmul, device, repeats,
                                       max(warmup - 1, 0)))
    return out


def memory_capacity(device: str) -> float:
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024  # kB
    raise UserError("calibrate: /proc/meminfo has no MemTotal line")


def device_description(device: str) -> str:
    """The GPU's name, or the CPU model (the same lookup result files record)."""
    from infbench.results.store import device_name

    return device_name(device)


def calibrate(device: str = "cpu", quick: bool = False,
              dtypes: tuple[str, ...] | None = None, name: str = "local",
              engine_terms: bool = True) -> HardwareSpec:
    """Measure bandwidths and GEMM peaks on `device` and return them as a HardwareSpec."""
    device = resolve_calibration_device(device)
    plan = PLANS[(device, quick)]
    if dtypes is None:
        dtypes = ("float32", "bfloat16") if device == "cpu" else ("float32", "bfloat16",
                                                                  "float16")
    unknown = [d for d in dtypes if d not in TORCH_DTYPES]
    if unknown:
        raise UserError(f"calibrate: unknown dtype {unknown[0]!r}; "
                        f"allowed: {', '.join(TORCH_DTYPES)}")
    figures: dict[str, Figure] = {
        "read_bytes_per_s": read_bandwidth(device, plan.buffer_bytes, plan.repeats,
                                           plan.warmup),
        "copy_bytes_per_s": copy_bandwidth(device, plan.buffer_bytes, plan.repeats,
                                           plan.warmup),
    }
    gemv_dtype = "float32" if device == "cpu" else "bfloat16"  # bf16 GEMV is emulated on CPU
    figures["gemv_bytes_per_s"] = gemv_bandwidth(device, plan.gemv_shape,
                                                 TORCH_DTYPES[gemv_dtype], plan.repeats,
                                                 plan.warmup)
    per_size = {d: gemm_flops(device, TORCH_DTYPES[d], plan.gemm_sizes, plan.repeats, plan.warmup,
                              plan.max_single_s) for d in dtypes}
    for d, by_size in per_size.items():
        figures.update({f"gemm.{d}.{n}": fig for n, fig in by_size.items()})
    read = figures["read_bytes_per_s"].value
    peaks = {d: max(f.value for f in v.values()) for d, v in per_size.items()}
    threads = torch.get_num_threads()
    desc = device_description(device)
    machine = this_machine()
    extra: dict[str, Any] = {
        "device": device,
        "quick": quick,
        # `hardware: auto` finds this profile again on this machine (hardware.machine)
        "machine": machine.key,
        "machine_description": machine.describe(),
        "read_bytes_per_s": read,
        "copy_bytes_per_s": figures["copy_bytes_per_s"].value,
        "gemv_bytes_per_s": figures["gemv_bytes_per_s"].value,
        "gemv_shape": list(plan.gemv_shape),
        "gemv_dtype": gemv_dtype,
        "gemm_flops_per_s": {d: {str(n): f.value for n, f in v.items()}
                             for d, v in per_size.items()},
        "buffer_bytes": plan.buffer_bytes,
        "repeats": plan.repeats,
        "warmup": plan.warmup,
        "torch_threads": threads,
        "torch_version": torch.__version__,
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    bandwidth = read
    if engine_terms:
        from infbench.measure.calibrate_engine import engine_extra

        engine, engine_figures = engine_extra(device, dtypes, quick)
        extra.update(engine)
        figures.update(engine_figures)
        # The engine's own batch-1 GEMV over a weight stack four times the last-level cache
        # streams them faster than x.sum() does on some CPUs (each thread prefetching its
        # own slice of rows): the roofline ceiling is the best streaming rate measured, so
        # take the higher of the two.
        curve = extra["matmul_flops_by_tokens"].get("float32")
        if curve and not quick:  # quick mode's 16 MB of weights sit in cache
            gemv = curve[0][1] / 2.0 * 4.0  # fp32: 2 FLOPs per 4-byte weight at M = 1
            extra["engine_gemv_bytes_per_s"] = gemv
            bandwidth = max(read, gemv)
    extra.update({"figures": {k: f.to_dict() for k, f in figures.items()},
                  "spread_limit": SPREAD_LIMIT, "max_rounds": MAX_ROUNDS})
    check = check_profile(extra)
    if check.errors:  # before anything is written: the previous profile stays
        more = f" (and {len(check.errors) - 1} more)" if len(check.errors) > 1 else ""
        raise UserError(f"calibrate: profile {name!r} refused, nothing saved: "
                        f"{check.errors[0]}{more}; re-run `infbench calibrate` on an idle "
                        "machine")
    extra["flags"] = check.flags
    return HardwareSpec(
        name=name,
        description=f"{desc} ({threads} torch threads), calibrated" if device == "cpu"
        else f"{desc}, calibrated",
        peak_flops=peaks,
        bandwidth=bandwidth,
        memory_bytes=memory_capacity(device),
        source="infbench calibrate" + (" --quick" if quick else "")
        + f": best of {plan.repeats} repeats per round, up to {MAX_ROUNDS} rounds",
        kind="gpu" if device == "cuda" else "cpu",
        extra=extra,
    )


def save_profile(spec: HardwareSpec, name: str = "local") -> Path:
    """Write `spec` as the profile `name` (atomic: a temp file renamed into place)."""
    path = profile_path(name)
    data = asdict(spec)
    data["name"] = name
    write_json_atomic(path, data, sort_keys=True)
    return path


def measure_reference_bandwidth(device: str = "cpu", seconds: float = 0.5,
                                nbytes: int | None = None) -> float:
    """Median read bandwidth (bytes/s) of repeated `x.sum()` for about `seconds`.

    Taken in the same process as a measured run, it tells how fast memory is *now*:
    tokens/s divided by it is comparable across runs on a shared, noisy machine.
    """
    device = resolve_calibration_device(device)
    nbytes = nbytes or (128 * _MB if device == "cpu" else 1024 * _MB)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    inner = _inner(device)
    samples = time_op(lambda: x.sum(), device, 1, 1, inner)  # warm-up + first sample
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 3:
        samples += time_op(lambda: x.sum(), device, 1, 0, inner)
    return x.numel() * 4 / statistics.median(samples)
