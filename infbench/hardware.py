"""Hardware specs: peak dense FLOP/s per dtype, memory bandwidth and capacity.

Decimal units throughout (1 TB/s = 1e12 B/s, 80 GB = 80e9 B), dense (not 2:4
sparse) tensor-core peaks, from the vendors' datasheets cited per entry.  The
ridge point (FLOP per byte above which a kernel is compute-bound) is derived,
never stored: h100-sxm bf16 is 989.4e12 / 3.35e12 = 295.

`hardware: local` names a profile measured by `infbench calibrate` and stored as
JSON (see `profile_path`); any other name may also be a path to such a file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infbench.errors import UserError


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    description: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    bandwidth: float  # bytes/s (memory to compute units)
    memory_bytes: float  # device memory capacity, bytes
    source: str = ""
    kind: str = "gpu"  # gpu | cpu
    extra: dict[str, Any] = field(default_factory=dict)  # calibration details

    def peak(self, dtype: str) -> float:
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        # bfloat16 and float16 share tensor-core rates on every listed part.
        alias = {"bfloat16": "float16", "float16": "bfloat16"}.get(dtype)
        if alias and alias in self.peak_flops:
            return self.peak_flops[alias]
        raise UserError(
            f"hardware {self.name!r} has no peak for dtype {dtype!r}; "
            f"allowed: {', '.join(self.peak_flops)}"
        )

    def peak_at(self, dtype: str, num_tokens: int | None = None) -> float:
        """Attainable matmul FLOP/s for a step of `num_tokens` rows.

        A calibrated profile carries the engine's measured curve
        (`extra.matmul_flops_by_tokens`, see infbench.calibrate_engine); it is
        interpolated in log(tokens) and capped at the dtype's peak.  Datasheet entries
        have no curve: their peak applies at every size (the plain roofline).
        """
        peak = self.peak(dtype)
        curve = (self.extra.get("matmul_flops_by_tokens") or {}).get(dtype)
        if not curve or num_tokens is None:
            return peak
        pts = sorted((float(m), float(f)) for m, f in curve)
        n = float(max(num_tokens, 1))
        if n <= pts[0][0]:
            return min(pts[0][1], peak)
        for (m0, f0), (m1, f1) in zip(pts, pts[1:], strict=False):
            if n <= m1:
                w = (math.log(n) - math.log(m0)) / (math.log(m1) - math.log(m0))
                return min(f0 + w * (f1 - f0), peak)
        return min(pts[-1][1], peak)

    def step_overhead_s(self, num_layers: int, num_seqs: int = 1) -> float:
        """Fixed cost of one engine step (dispatch, Python), when the profile measured it."""
        extra = self.extra
        per_layer = float(extra.get("layer_overhead_s", 0.0)) + num_seqs * float(
            extra.get("seq_layer_overhead_s", 0.0))
        return float(extra.get("step_overhead_s", 0.0)) + num_layers * per_layer

    def ridge_point(self, dtype: str = "bfloat16") -> float:
        """FLOP per byte where the bandwidth slope meets the compute ceiling."""
        return self.peak(dtype) / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpu(name: str, desc: str, bf16: float, fp32: float, fp8: float | None, bw: float,
         mem: float, source: str) -> HardwareSpec:
    flops = {"bfloat16": bf16, "float16": bf16, "float32": fp32}
    if fp8:
        flops["float8"] = fp8
        flops["int8"] = fp8
    return HardwareSpec(name, desc, flops, bw, mem, source)


HARDWARE: dict[str, HardwareSpec] = {
    "h100-sxm": _gpu(
        "h100-sxm", "NVIDIA H100 SXM5 80GB HBM3", 989.4e12, 66.9e12, 1978.9e12, 3.35e12, 80e9,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1979 TFLOPS with sparsity, "
        "FP32 67 TFLOPS, 3.35 TB/s",
    ),
    "h100-pcie": _gpu(
        "h100-pcie", "NVIDIA H100 PCIe 80GB HBM2e", 756.5e12, 51.2e12, 1513e12, 2.0e12, 80e9,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1513 TFLOPS with sparsity, "
        "FP32 51 TFLOPS, 2.0 TB/s",
    ),
    "h200": _gpu(
        "h200", "NVIDIA H200 SXM 141GB HBM3e", 989.4e12, 66.9e12, 1978.9e12, 4.8e12, 141e9,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): same compute as H100 SXM, 4.8 TB/s, 141 GB",
    ),
    "a100-80g": _gpu(
        "a100-80g", "NVIDIA A100 SXM4 80GB HBM2e", 312e12, 19.5e12, None, 2.039e12, 80e9,
        "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, FP32 19.5 TFLOPS, 2039 GB/s",
    ),
    "a100-40g": _gpu(
        "a100-40g", "NVIDIA A100 SXM4 40GB HBM2", 312e12, 19.5e12, None, 1.555e12, 40e9,
        "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, FP32 19.5 TFLOPS, 1555 GB/s",
    ),
    "l40s": _gpu(
        "l40s", "NVIDIA L40S 48GB GDDR6", 362.05e12, 91.6e12, 733e12, 0.864e12, 48e9,
        "NVIDIA L40S datasheet (2023): BF16 362.05 TFLOPS dense (733 with sparsity), "
        "FP32 91.6 TFLOPS, 864 GB/s",
    ),
    # The 2-core development/CI machine, measured with `infbench calibrate` on 2026-11-29
    # (AMD EPYC, 2 torch threads): x.sum() read 30-33 GB/s, fp32 GEMM 186-197 GFLOP/s,
    # bf16 GEMM 430 GFLOP/s (this CPU has native bf16 dot products; ENVIRONMENT.md's older
    # machine read 17 GB/s at 66 GFLOP/s), 25.3 GB MemTotal.  A starting point only: run
    # `infbench calibrate` and use `hardware: local` for predictions on your CPU.
    "cpu": HardwareSpec(
        "cpu", "2-core x86-64 CPU (AMD EPYC), measured on the development machine",
        {"float32": 195e9, "bfloat16": 430e9}, 32e9, 25.3e9,
        "infbench calibrate on the 2-core dev machine, 2026-11-29: read 32 GB/s, "
        "fp32 GEMM 195 GFLOP/s, bf16 GEMM 430 GFLOP/s",
        kind="cpu",
    ),
}


def profile_dir() -> Path:
    """Where calibrated profiles live ($INFBENCH_HOME/hardware, default ~/.cache/infbench)."""
    home = os.environ.get("INFBENCH_HOME") or Path.home() / ".cache" / "infbench"
    return Path(home) / "hardware"


def profile_path(name: str = "local") -> Path:
    return profile_dir() / f"{name}.json"


def load_profile(path: Path) -> HardwareSpec:
    try:
        data = json.loads(path.read_text())
        return HardwareSpec(
            name=str(data["name"]),
            description=str(data.get("description", "calibrated profile")),
            peak_flops={k: float(v) for k, v in data["peak_flops"].items()},
            bandwidth=float(data["bandwidth"]),
            memory_bytes=float(data["memory_bytes"]),
            source=str(data.get("source", str(path))),
            kind=str(data.get("kind", "cpu")),
            extra=dict(data.get("extra", {})),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a hardware profile ({exc})") from None


def get_hardware(name: str) -> HardwareSpec:
    """A table entry, `local` (the calibrated profile) or a path to a profile JSON."""
    key = name.lower()
    if key in HARDWARE:
        return HARDWARE[key]
    if key == "local" or (profile_dir() / f"{key}.json").exists():
        path = profile_path(key)
        if not path.exists():
            raise UserError(
                f"hardware {name!r}: no calibrated profile at {path}; run `infbench calibrate`"
            )
        return load_profile(path)
    if name.endswith(".json"):
        if not Path(name).exists():
            raise UserError(f"hardware profile {name} does not exist")
        return load_profile(Path(name))
    raise UserError(
        f"unknown hardware {name!r}; allowed: {', '.join(HARDWARE)}, local, or a profile .json"
    )
