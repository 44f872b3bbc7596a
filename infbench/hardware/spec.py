"""Hardware specs: peak dense FLOP/s per dtype, memory bandwidth and capacity.

Decimal units for rates (1 TB/s = 1e12 B/s), dense (not 2:4 sparse) tensor-core peaks,
from the vendors' datasheets cited per entry (`float8`: FP8 E4M3/E5M2; `float4`: the 4-bit
block-scaled formats NVFP4 / MXFP4, on the parts whose tensor cores run them; a part without
a `float4` peak cannot price 4-bit activations); capacities in bytes as the device reports
them (an "80 GB" H100 reports 81,559 MiB), of which `MemoryReserve` keeps a documented
share back.  The
ridge point (FLOP per byte above which a kernel is compute-bound) is derived,
never stored: h100-sxm bf16 is 989.4e12 / 3.35e12 = 295.

`hardware: local` names a profile measured by `infbench calibrate` and stored as
JSON (see `profile_path`); any other name may also be a path to such a file.
`hardware: auto`, the default on a CPU, is this machine (`machine_profile`): the newest
full profile `infbench calibrate` measured on it, else the quick read-bandwidth probe `run`
takes once per machine (`measure.machine`), both found by the machine's identity
(`hardware.machine`); only where neither exists yet (an analytic command on a new machine)
is it the built-in `cpu` entry, another machine's figures, and its description says so.

One rule for every spec, built-in or loaded: `HardwareSpec.__post_init__` refuses a
peak, bandwidth or capacity that is not a finite number > 0, a dtype outside
`PEAK_DTYPES`, and a malformed calibration curve; `load_profile` first checks the
file against `profile_schema()` (pydantic: extra keys forbidden, types strict) so a
damaged profile is one line naming the file and the key, never a traceback, then runs
`hardware.checks.check_profile` on it: figures that contradict each other beyond
repair are refused the same way, and what is only doubtful joins the profile's flags
(`HardwareSpec.profile_flags`).  A profile written before calibrations kept their repeats
(no `extra.figures`) loads unflagged, with its spread unknown (`spread_known` is False).
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from infbench.core.errors import ConfigError, UserError
from infbench.core.formats import QUANTIZED_WEIGHTS, QuantizedWeights
from infbench.core.io import read_text
from infbench.hardware.checks import check_profile, merge_flags
from infbench.hardware.machine import Machine, this_machine

if TYPE_CHECKING:
    from pydantic import BaseModel

# Dtypes a peak (or a calibrated matmul curve) may be given for.
PEAK_DTYPES = ("float32", "float16", "bfloat16", "float8", "float4", "int8")
HARDWARE_KINDS = ("gpu", "cpu")
# `extra` keys the analysis reads (the rest of `extra` is calibration detail).
_OVERHEAD_KEYS = ("step_overhead_s", "layer_overhead_s", "seq_layer_overhead_s")
CURVE_KEY = "matmul_flops_by_tokens"
ATTENTION_KEY = "decode_attention_bytes_per_s"  # the engine's decode attention kernel
PREFILL_ATTENTION_KEY = "prefill_attention_flops_per_s"  # and its prefill attention kernel
QUANT_CURVE_KEY = "quant_matmul_flops_by_tokens"  # its int8 / int4 decode projections
QUANT_FORMATS = QUANTIZED_WEIGHTS  # the calibrated quantized curves: one per format
# measured / priced engine step by token count, per model (measure/calibrate_model.py)
MODEL_STEPS_KEY = "model_steps"


def _finite(value: object, allow_zero: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    x = float(value)
    return math.isfinite(x) and (x >= 0 if allow_zero else x > 0)


def interpolate_curve(curve: list[Any], num_tokens: int) -> float:
    """A [[rows, FLOP/s], ...] curve at `num_tokens` rows, linear in log(rows), flat past
    its ends."""
    pts = sorted((float(m), float(f)) for m, f in curve)
    n = float(max(num_tokens, 1))
    if n <= pts[0][0]:
        return pts[0][1]
    for (m0, f0), (m1, f1) in zip(pts, pts[1:], strict=False):
        if n <= m1:
            w = (math.log(n) - math.log(m0)) / (math.log(m1) - math.log(m0))
            return f0 + w * (f1 - f0)
    return pts[-1][1]


def check_curve(dtype: object, curve: object, allowed: tuple[str, ...] = PEAK_DTYPES,
                what: str = "dtype") -> str | None:
    """Why a matmul curve [[rows, FLOP/s], ...] of `dtype` (one of `allowed`, a `what`) is
    malformed, or None when it is fine."""
    if dtype not in allowed:
        return f"unknown {what} {dtype!r}; allowed: {', '.join(allowed)}"
    if not isinstance(curve, (list, tuple)) or not curve:
        return "must be a non-empty list of [rows, FLOP/s] pairs"
    last = 0.0
    for i, point in enumerate(curve):
        if (not isinstance(point, (list, tuple)) or len(point) != 2
                or not all(_finite(v) for v in point)):
            return f"[{i}] must be a [rows, FLOP/s] pair of finite numbers > 0, got {point!r}"
        if point[0] <= last:
            return f"[{i}] rows must increase strictly along the curve, got {point[0]} after {last}"
        last = point[0]
    return None


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
    interconnect: Interconnect | None = None  # None: a single device (calibrated profiles)

    def __post_init__(self) -> None:
        def bad(key: str, what: str) -> ConfigError:
            return ConfigError(f"hardware {self.name!r}: {key} {what}")

        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"hardware name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.peak_flops, dict) or not self.peak_flops:
            raise bad("peak_flops", "must be a non-empty mapping dtype -> FLOP/s, got "
                      f"{self.peak_flops!r}")
        for dtype, peak in self.peak_flops.items():
            if dtype not in PEAK_DTYPES:
                raise bad(f"peak_flops.{dtype}", f"is not a known dtype; allowed: "
                          f"{', '.join(PEAK_DTYPES)}")
            if not _finite(peak):
                raise bad(f"peak_flops.{dtype}", f"must be a finite number > 0 (FLOP/s), "
                          f"got {peak!r}")
        for key, unit in (("bandwidth", "bytes/s"), ("memory_bytes", "bytes")):
            if not _finite(getattr(self, key)):
                raise bad(key, f"must be a finite number > 0 ({unit}), got {getattr(self, key)!r}")
        if self.kind not in HARDWARE_KINDS:
            raise bad("kind", f"unknown value {self.kind!r}; allowed: {', '.join(HARDWARE_KINDS)}")
        if not isinstance(self.extra, dict):
            raise bad("extra", f"must be a mapping, got {type(self.extra).__name__}")
        for key in _OVERHEAD_KEYS:
            if key in self.extra and not _finite(self.extra[key], allow_zero=True):
                raise bad(f"extra.{key}", f"must be a finite number >= 0 (seconds), "
                          f"got {self.extra[key]!r}")
        for key, unit in ((ATTENTION_KEY, "bytes/s"), (PREFILL_ATTENTION_KEY, "FLOP/s")):
            value = self.extra.get(key)
            if value is not None and not _finite(value):
                raise bad(f"extra.{key}", f"must be a finite number > 0 ({unit}), "
                          f"got {value!r}")
        quant_curves = self.extra.get(QUANT_CURVE_KEY)
        if quant_curves is not None:
            if not isinstance(quant_curves, dict):
                raise bad(f"extra.{QUANT_CURVE_KEY}",
                          "must be a mapping int8|int4 -> [[rows, FLOP/s], ...]")
            for fmt, curve in quant_curves.items():
                problem = check_curve(fmt, curve, QUANT_FORMATS, "format")
                if problem:
                    raise bad(f"extra.{QUANT_CURVE_KEY}.{fmt}", problem)
        curves = self.extra.get(CURVE_KEY)
        if curves is not None:
            if not isinstance(curves, dict):
                raise bad(f"extra.{CURVE_KEY}", "must be a mapping dtype -> [[rows, FLOP/s], ...]")
            for dtype, curve in curves.items():
                problem = check_curve(dtype, curve)
                if problem:
                    raise bad(f"extra.{CURVE_KEY}.{dtype}", problem)

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
        (`extra.matmul_flops_by_tokens`, see infbench.measure.calibrate_engine); it is
        interpolated in log(tokens) and capped at the dtype's peak.  Datasheet entries
        have no curve: their peak applies at every size (the plain roofline).
        """
        peak = self.peak(dtype)
        curve = (self.extra.get("matmul_flops_by_tokens") or {}).get(dtype)
        if not curve or num_tokens is None:
            return peak
        return min(interpolate_curve(curve, num_tokens), peak)

    def quant_rate(self, fmt: str, num_tokens: int) -> float | None:
        """FLOP/s of the engine's `fmt` (int8 | int4) decode projections at `num_tokens` rows,
        from the profile's `extra.quant_matmul_flops_by_tokens`; None when the profile has
        no such curve or the rows are past its last point (there the engine dequantizes and
        runs the float GEMM, which `peak_at` prices)."""
        curve = (self.extra.get(QUANT_CURVE_KEY) or {}).get(fmt)
        if not curve or num_tokens > max(float(m) for m, _ in curve):
            return None
        return interpolate_curve(curve, num_tokens)

    @property
    def attention_bandwidth(self) -> float | None:
        """Bytes/s at which the engine's decode attention kernel reads the paged KV cache, when
        `infbench calibrate` measured it (`extra.decode_attention_bytes_per_s`); None for
        datasheet entries, whose attention reads KV at `bandwidth`."""
        value = self.extra.get(ATTENTION_KEY)
        return None if value is None else float(value)

    @property
    def prefill_attention_flops(self) -> float | None:
        """FLOP/s of the engine's causal prefill attention kernel, when `infbench calibrate`
        measured it (`extra.prefill_attention_flops_per_s`); None for datasheet entries."""
        value = self.extra.get(PREFILL_ATTENTION_KEY)
        return None if value is None else float(value)

    def step_overhead_s(self, num_layers: int, num_seqs: int = 1) -> float:
        """Fixed cost of one engine step (dispatch, Python), when the profile measured it."""
        extra = self.extra
        per_layer = float(extra.get("layer_overhead_s", 0.0)) + num_seqs * float(
            extra.get("seq_layer_overhead_s", 0.0))
        return float(extra.get("step_overhead_s", 0.0)) + num_layers * per_layer

    @property
    def profile_flags(self) -> list[str]:
        """What `infbench calibrate` (or loading the profile) flagged; [] when nothing."""
        return list(self.extra.get("flags") or [])

    @property
    def spread_known(self) -> bool:
        """Whether the profile kept the repeats of its figures (older profiles did not)."""
        return "figures" in self.extra

    def ridge_point(self, dtype: str = "bfloat16") -> float:
        """FLOP per byte where the bandwidth slope meets the compute ceiling."""
        return self.peak(dtype) / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The spec as a result file records it (results/schema.py `Hardware`): a run is
        measured on one device, so the interconnect is left out."""
        d = asdict(self)
        del d["interconnect"]
        return d


MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Interconnect:
    """How devices of one part talk to each other; bandwidths in bytes/s per direction.

    Three tiers, fastest first: the scale-up link (NVLink, Infinity Fabric, ICI) joins
    `link_domain` devices; PCIe joins the `devices_per_node` devices of one host; the
    network (`network_bytes_per_s` per device) joins hosts.  `topology` says how the
    scale-up link adds up: `switch` (NVSwitch: every device reaches the group at
    `link_bytes_per_s`), `mesh` (fully connected: `link_bytes_per_s` to each peer, so a
    group of n reaches (n - 1) times that), `torus` (TPU ICI: `link_bytes_per_s` is what
    a ring along one axis gets, both directions of its links).  The latencies are the
    fixed cost of one hop of a collective (one ring step).
    """

    link: str  # nvlink4 | nvlink5 | infinity-fabric | ici | pcie | unified
    link_bytes_per_s: float
    link_domain: int
    devices_per_node: int
    pcie_bytes_per_s: float
    network_bytes_per_s: float
    topology: str = "switch"  # switch | mesh | torus
    link_latency_s: float = 1e-6
    pcie_latency_s: float = 2e-6
    network_latency_s: float = 5e-6

    def tier(self, group: int, span: int | None = None) -> tuple[str, float, float]:
        """(tier, bytes/s per direction, latency per hop) of a collective over `group`
        devices whose placement spans `span` consecutive devices (default: the group)."""
        span = span or group
        if span <= self.link_domain and self.link_domain > 1:
            bw = self.link_bytes_per_s * (group - 1 if self.topology == "mesh" else 1)
            return self.link, bw, self.link_latency_s
        if span <= self.devices_per_node:
            return "pcie", self.pcie_bytes_per_s, self.pcie_latency_s
        return "network", self.network_bytes_per_s, self.network_latency_s


def _gpu(name: str, desc: str, bf16: float, fp32: float | None, fp8: float | None, bw: float,
         mem: float, source: str, net: Interconnect | None = None, *, fp4: float | None = None,
         int8: float | Literal["fp8"] | None = "fp8") -> HardwareSpec:
    """A GPU entry from its dense peaks.  int8 is the FP8 rate by default (the same
    tensor-core throughput on the parts before Blackwell Ultra, which cut INT8); None: no
    int8 peak (an int8 GEMM on such a part is refused, not priced at a guess)."""
    flops = {"bfloat16": bf16, "float16": bf16}
    if fp32:
        flops["float32"] = fp32
    if fp8:
        flops["float8"] = fp8
    int8_peak = fp8 if int8 == "fp8" else int8
    if int8_peak:
        flops["int8"] = int8_peak
    if fp4:
        flops["float4"] = fp4
    return HardwareSpec(name, desc, flops, bw, mem, source, interconnect=net)


def _nvlink(gen: int, per_direction: float, pcie: float, network: float,
            domain: int = 8, node: int = 8) -> Interconnect:
    return Interconnect(f"nvlink{gen}", per_direction, domain, node, pcie, network)


def _pcie_only(pcie: float, network: float, node: int = 8) -> Interconnect:
    return Interconnect("pcie", pcie, 1, node, pcie, network)


# Capacities are what the device reports (nvidia-smi's "MiB" total, x 2**20), not the
# marketing figure: an "80 GB" H100 reports 81,559 MiB = 85.5e9 bytes.  Where no device
# report could be checked the entry says so and uses the datasheet figure.
# Interconnects: per direction (NVLink 4's "900 GB/s" is 450 GB/s each way); PCIe Gen4 x16
# 32 GB/s and Gen5 x16 64 GB/s each way; network: the NIC per device (400 Gb/s = 50 GB/s).
HARDWARE: dict[str, HardwareSpec] = {
    "h100-sxm": _gpu(
        "h100-sxm", "NVIDIA H100 SXM5 80GB HBM3", 989.4e12, 66.9e12, 1978.9e12, 3.35e12,
        81559 * MIB,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1979 TFLOPS with sparsity, "
        "FP32 67 TFLOPS, 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s; nvidia-smi "
        "81,559 MiB; DGX H100: 8 GPUs on NVSwitch, 400 Gb/s ConnectX-7 per GPU",
        _nvlink(4, 450e9, 64e9, 50e9),
    ),
    "h100-pcie": _gpu(
        "h100-pcie", "NVIDIA H100 PCIe 80GB HBM2e", 756.5e12, 51.2e12, 1513e12, 2.0e12,
        81559 * MIB,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1513 TFLOPS with sparsity, "
        "FP32 51 TFLOPS, 2.0 TB/s, NVLink bridge 600 GB/s (pairs), PCIe Gen5 128 GB/s; "
        "nvidia-smi 81,559 MiB",
        _nvlink(4, 300e9, 64e9, 50e9, domain=2),
    ),
    "h200": _gpu(
        "h200", "NVIDIA H200 SXM 141GB HBM3e", 989.4e12, 66.9e12, 1978.9e12, 4.8e12,
        143771 * MIB,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): same compute as H100 SXM, 4.8 TB/s, "
        "141 GB, NVLink 900 GB/s; nvidia-smi 143,771 MiB",
        _nvlink(4, 450e9, 64e9, 50e9),
    ),
    "b200": _gpu(
        "b200", "NVIDIA B200 (HGX B200) HBM3e", 2.25e15, 75e12, 4.5e15, 8.0e12, 183359 * MIB,
        "NVIDIA HGX B200 datasheet (2024), per GPU of 8: BF16 36 PFLOPS / 8 with sparsity "
        "(2.25 dense), FP8 72 / 8 with sparsity (4.5 dense), FP4 144 / 8 with sparsity (9 "
        "dense), FP32 600 / 8 TFLOPS, 64 / 8 TB/s, NVLink 5 1.8 TB/s; nvidia-smi 183,359 MiB",
        _nvlink(5, 900e9, 64e9, 50e9), fp4=9e15,
    ),
    "b300": _gpu(
        "b300", "NVIDIA B300 (HGX B300, Blackwell Ultra) HBM3e", 2.25e15, 75e12, 4.5e15, 8.0e12,
        288e9,
        "NVIDIA HGX B300 datasheet (2025), per GPU of 8: FP4 144 / 8 PFLOPS with sparsity, "
        "108 / 8 without (13.5 dense), FP8 72 / 8 and BF16 36 / 8 with sparsity (4.5 and 2.25 "
        "dense), FP32 600 / 8 TFLOPS, NVLink 5 1.8 TB/s, 800 Gb/s ConnectX-8 per GPU, PCIe "
        "Gen6; 8 TB/s and 288 GB HBM3e per GPU (Hot Chips 2025); INT8 cut to a few POPS per "
        "8 GPUs, so no int8 peak is listed; capacity: the datasheet's 288 GB (device report "
        "not checked)",
        _nvlink(5, 900e9, 128e9, 100e9), fp4=13.5e15, int8=None,
    ),
    "gb200": _gpu(
        "gb200", "NVIDIA GB200 NVL72, one Blackwell GPU of 72 HBM3e", 2.5e15, 80e12, 5e15,
        8.0e12, 186e9,
        "NVIDIA GB200 NVL72 datasheet (2024), per Blackwell GPU: FP4 20 PFLOPS, FP8 10, "
        "FP16/BF16 5, INT8 10 POPS, all with sparsity (10 / 5 / 2.5 / 5 dense), FP32 80 "
        "TFLOPS, 186 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s; 72 GPUs in one NVLink domain "
        "(130 TB/s NVLink Switch System, 9 switch trays), 4 GPUs per compute tray, 400 Gb/s "
        "ConnectX-7 per GPU; capacity: the datasheet's 186 GB (device report not checked)",
        _nvlink(5, 900e9, 64e9, 50e9, domain=72, node=4), fp4=10e15,
    ),
    "a100-80g": _gpu(
        "a100-80g", "NVIDIA A100 SXM4 80GB HBM2e", 312e12, 19.5e12, None, 2.039e12, 81920 * MIB,
        "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, FP32 19.5 TFLOPS, 2039 GB/s, NVLink "
        "600 GB/s, PCIe Gen4 64 GB/s; nvidia-smi 81,920 MiB; DGX A100: 200 Gb/s HDR per GPU",
        _nvlink(3, 300e9, 32e9, 25e9),
    ),
    "a100-40g": _gpu(
        "a100-40g", "NVIDIA A100 SXM4 40GB HBM2", 312e12, 19.5e12, None, 1.555e12, 40960 * MIB,
        "NVIDIA A100 datasheet (2021): BF16 312 TFLOPS, FP32 19.5 TFLOPS, 1555 GB/s, NVLink "
        "600 GB/s; nvidia-smi 40,960 MiB",
        _nvlink(3, 300e9, 32e9, 25e9),
    ),
    "h20": _gpu(
        "h20", "NVIDIA H20 96GB HBM3", 148e12, 44e12, 296e12, 4.0e12, 96e9,
        "NVIDIA H20 product brief (2024): BF16 148 TFLOPS dense, FP8 296, FP32 44 TFLOPS, "
        "4.0 TB/s, NVLink 900 GB/s; capacity: the datasheet's 96 GB (device report not checked)",
        _nvlink(4, 450e9, 64e9, 50e9),
    ),
    "l40s": _gpu(
        "l40s", "NVIDIA L40S 48GB GDDR6", 362.05e12, 91.6e12, 733e12, 0.864e12, 46068 * MIB,
        "NVIDIA L40S datasheet (2023): BF16 362.05 TFLOPS dense (733 with sparsity), "
        "FP32 91.6 TFLOPS, 864 GB/s, PCIe Gen4 x16, no NVLink; nvidia-smi 46,068 MiB",
        _pcie_only(32e9, 25e9),
    ),
    "l4": _gpu(
        "l4", "NVIDIA L4 24GB GDDR6", 121e12, 30.3e12, 242.5e12, 0.3e12, 23034 * MIB,
        "NVIDIA L4 datasheet (2023): BF16 242 TFLOPS with sparsity (121 dense), FP8 485 with "
        "sparsity, FP32 30.3 TFLOPS, 300 GB/s, PCIe Gen4 x16; nvidia-smi 23,034 MiB",
        _pcie_only(32e9, 12.5e9),
    ),
    "a10g": _gpu(
        "a10g", "NVIDIA A10G 24GB GDDR6 (AWS G5)", 70e12, 31.2e12, None, 0.6e12, 23028 * MIB,
        "AWS G5 / NVIDIA A10G: 24 GB GDDR6 at 600 GB/s, FP32 31.2 TFLOPS; tensor BF16 about "
        "70 TFLOPS dense (no public NVIDIA datasheet; the A10's is 125); nvidia-smi 23,028 MiB",
        _pcie_only(32e9, 12.5e9),
    ),
    "rtx4090": _gpu(
        "rtx4090", "NVIDIA GeForce RTX 4090 24GB GDDR6X", 165.2e12, 82.6e12, 330.3e12, 1.008e12,
        24564 * MIB,
        "NVIDIA Ada Lovelace architecture whitepaper (2022), RTX 4090: FP16/BF16 tensor with "
        "FP32 accumulate 165.2 TFLOPS dense, FP8 330.3, FP32 82.6 TFLOPS, 1008 GB/s, PCIe Gen4, "
        "no NVLink; nvidia-smi 24,564 MiB",
        _pcie_only(32e9, 3.125e9),
    ),
    "mi300x": _gpu(
        "mi300x", "AMD Instinct MI300X 192GB HBM3", 1307.4e12, 163.4e12, 2614.9e12, 5.3e12,
        192e9,
        "AMD Instinct MI300X data sheet (2023): BF16 1307.4 TFLOPS dense, FP8 2614.9, FP32 "
        "matrix 163.4, 5.3 TB/s, 7 Infinity Fabric links at 64 GB/s each way to each peer "
        "(8 GPUs fully connected), PCIe Gen5; capacity: the datasheet's 192 GB",
        Interconnect("infinity-fabric", 64e9, 8, 8, 64e9, 50e9, topology="mesh"),
    ),
    "mi325x": _gpu(
        "mi325x", "AMD Instinct MI325X 256GB HBM3E", 1307.4e12, 163.4e12, 2614.9e12, 6.0e12,
        256e9,
        "AMD Instinct MI325X data sheet (2024): compute as MI300X (BF16 1307.4 TFLOPS dense), "
        "6 TB/s, Infinity Fabric as MI300X; capacity: the datasheet's 256 GB",
        Interconnect("infinity-fabric", 64e9, 8, 8, 64e9, 50e9, topology="mesh"),
    ),
    "mi355x": _gpu(
        "mi355x", "AMD Instinct MI355X 288GB HBM3E", 2516.6e12, 157.3e12, 5033.2e12, 8.0e12,
        288e9,
        "AMD Instinct MI355X data sheet (2025): FP16/BF16 2.5 PFLOPS dense (5.0 with "
        "sparsity), FP8 5.0 dense (10.1 with sparsity), MXFP6/MXFP4 10.1 dense, INT8 5.0 "
        "POPS, FP32 157.3 TFLOPS (256 CUs at 2.4 GHz: 4,096 / 8,192 / 16,384 BF16 / FP8 / FP4 "
        "FLOPs per CU per clock, ISSCC 2026), 288 GB HBM3E at 8 TB/s, 7 Infinity Fabric links "
        "at 153.6 GB/s (76.8 each way) to each peer, 8 GPUs fully connected, PCIe Gen5 x16, "
        "400 Gb/s NIC per GPU; capacity: the datasheet's 288 GB (device report not checked)",
        Interconnect("infinity-fabric", 76.8e9, 8, 8, 64e9, 50e9, topology="mesh"),
        fp4=10066.3e12,
    ),
    # TPUs: Google Cloud TPU docs (HBM in GiB, peaks per chip); ICI per ring along one torus
    # axis from "How to Scale Your Model" (the Scaling Book), both directions of a link.
    "tpu-v5e": _gpu(
        "tpu-v5e", "Google Cloud TPU v5e (one chip)", 197e12, None, None, 819e9, 16 * GIB,
        "Google Cloud TPU v5e docs: 197 TFLOPS BF16, 394 TOPS INT8, 16 GiB HBM2 at 819 GB/s, "
        "pods of 256 chips (2D torus); ICI 4.5e10 B/s one way per link (Scaling Book)",
        Interconnect("ici", 9e10, 256, 8, 9e10, 25e9, topology="torus"),
    ),
    "tpu-v5p": _gpu(
        "tpu-v5p", "Google Cloud TPU v5p (one chip)", 459e12, None, None, 2765e9, 95 * GIB,
        "Google Cloud TPU v5p docs: 459 TFLOPS BF16, 918 TOPS INT8, 95 GiB HBM2e at 2765 GB/s, "
        "3D torus; ICI 9e10 B/s one way per link (Scaling Book)",
        Interconnect("ici", 1.8e11, 8960, 4, 1.8e11, 25e9, topology="torus"),
    ),
    "tpu-v6e": _gpu(
        "tpu-v6e", "Google Cloud TPU v6e Trillium (one chip)", 918e12, None, None, 1640e9,
        32 * GIB,
        "Google Cloud TPU v6e docs: 918 TFLOPS BF16, 1836 TOPS INT8, 32 GiB HBM at 1640 GB/s, "
        "pods of 256 chips (2D torus); ICI 9e10 B/s one way per link (Scaling Book)",
        Interconnect("ici", 1.8e11, 256, 8, 1.8e11, 25e9, topology="torus"),
    ),
    # Apple publishes bandwidth and memory, not FLOP/s: the FP32/FP16 rate is derived
    # (40 GPU cores x 128 ALUs x 2 FLOP x ~1.58 GHz); macOS lets the GPU wire about 75% of
    # unified memory by default (Metal's recommendedMaxWorkingSetSize), which is the capacity.
    "m4-max": HardwareSpec(
        "m4-max", "Apple M4 Max (40-core GPU, 128 GB unified memory)",
        {"float32": 16.2e12, "float16": 16.2e12, "bfloat16": 16.2e12}, 546e9, 0.75 * 128 * GIB,
        "Apple M4 Max press release (2024): 546 GB/s, up to 128 GB; FLOP/s derived (40 cores x "
        "128 ALUs x 2 x 1.58 GHz); capacity: 75% of 128 GiB, macOS's default GPU working set",
        interconnect=Interconnect("unified", 1.0, 1, 1, 1.0, 1.25e9, topology="switch"),
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

# NVML device names (lower case, "NVIDIA " dropped) -> table entries: the first key that is
# a substring of the name wins, so the longer, more specific keys come first.
NVML_NAMES: tuple[tuple[str, str], ...] = (
    ("gh200", ""),  # Grace Hopper: its own memory and link, no entry (not an H200)
    ("h100 pcie", "h100-pcie"), ("h100 nvl", "h100-pcie"), ("h100", "h100-sxm"),
    ("h200", "h200"), ("gb200", "gb200"), ("b200", "b200"), ("b300", "b300"),
    ("h20", "h20"),
    ("a100-sxm4-80gb", "a100-80g"), ("a100 80gb", "a100-80g"), ("a100-pcie-80gb", "a100-80g"),
    ("a100-sxm4-40gb", "a100-40g"), ("a100-pcie-40gb", "a100-40g"),
    ("l40s", "l40s"), ("l4", "l4"), ("a10g", "a10g"), ("rtx 4090", "rtx4090"),
)


def entry_for_device_name(name: str) -> str | None:
    """The table entry of a device name as NVML reports it, or None when it has none."""
    lowered = name.lower().replace("nvidia ", "").replace("geforce ", "").strip()
    for key, entry in NVML_NAMES:
        if key in lowered:
            return entry or None
    return None


def nvml_device_name(index: int = 0) -> str | None:
    """The name NVML gives GPU `index` (nvidia-ml-py, imported here only), or None when
    NVML or a GPU is missing."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


AUTO = "auto"  # this machine: its calibrated profile, else its bandwidth probe


def default_hardware(device: str) -> str:
    """The hardware entry for a scenario with no `hardware:`: `auto` (this machine) on a
    CPU; on CUDA the table entry of the GPU NVML names.  Never a silent guess: a GPU without
    an entry, or no GPU NVML can see, is a UserError that says what to set."""
    if device == "cpu":
        return AUTO
    name = nvml_device_name()
    if name is None:
        raise UserError(
            "device cuda with no `hardware:` set, and no GPU could be identified (NVML: "
            "nvidia-ml-py or a driver missing); set `hardware:` to one of "
            f"{', '.join(HARDWARE)}, or run `infbench calibrate` and set `hardware: local`")
    entry = entry_for_device_name(name)
    if entry is None:
        raise UserError(
            f"GPU {name!r} has no entry in the hardware table; run `infbench calibrate` and "
            "set `hardware: local`, or set `hardware:` to the closest entry "
            f"({', '.join(HARDWARE)})")
    return entry


@dataclass(frozen=True)
class MemoryReserve:
    """What of a device's capacity the model may use (vLLM's accounting).

    utilization: the fraction of the reported capacity the serving process takes, as
      vLLM's `gpu_memory_utilization` (its default is 0.9; infbench's 0.95 leaves the CUDA
      context and allocator slack of an otherwise idle device).
    workspace_tokens: the activations of one forward step over this many tokens are
      held back as workspace (vLLM profiles a step of `max_num_batched_tokens`, 2048 by
      default for serving); the logits of each sequence (float32) are added per sequence.
    """

    utilization: float = 0.95
    workspace_tokens: int = 2048

    def __post_init__(self) -> None:
        if not _finite(self.utilization) or not 0 < self.utilization <= 1:
            raise ConfigError(f"memory utilization must be in (0, 1], got {self.utilization!r}")
        if (isinstance(self.workspace_tokens, bool) or not isinstance(self.workspace_tokens, int)
                or self.workspace_tokens < 0):
            raise ConfigError(f"workspace tokens must be an integer >= 0, got "
                              f"{self.workspace_tokens!r}")


NO_RESERVE = MemoryReserve(1.0, 0)


def profile_dir() -> Path:
    """Where calibrated profiles and bandwidth probes live: $INFBENCH_HOME/hardware, else
    $XDG_CACHE_HOME/infbench/hardware, else ~/.cache/infbench/hardware."""
    home = os.environ.get("INFBENCH_HOME")
    if home:
        return Path(home) / "hardware"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "infbench" / "hardware"


def profile_path(name: str = "local") -> Path:
    return profile_dir() / f"{name}.json"


MAX_PROFILE_NAME = 64
_PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


def check_profile_name(name: str) -> str:
    """A name `infbench calibrate --name` may save a profile under: what `hardware: NAME`
    finds again (names are matched in lower case; the table's entries and `auto` come
    first, so a profile under one of those names would never be read).  UserError
    otherwise."""
    allowed = (f"allowed: lower-case letters, digits, '.', '_' and '-', starting with a "
               f"letter or digit, at most {MAX_PROFILE_NAME} characters; e.g. local")
    shown = name if len(name) <= 40 else f"{name[:30]}...({len(name)} characters)"
    if not _PROFILE_NAME.fullmatch(name) or len(name) > MAX_PROFILE_NAME \
            or name.endswith(".json"):
        raise UserError(f"--name {shown!r}: not a usable profile name; {allowed}")
    if name in HARDWARE or name == AUTO:
        raise UserError(f"--name {name!r}: a built-in hardware name, which `hardware: {name}` "
                        "resolves before any profile; choose another, e.g. local")
    return name


def probe_path(machine: Machine | None = None) -> Path:
    """Where this machine's read-bandwidth probe is cached (`measure.machine`)."""
    return profile_dir() / f"probe-{(machine or this_machine()).key}.json"


def _stored_machine(path: Path) -> tuple[str | None, str | None, bool]:
    """(extra.machine, extra.device, extra.quick) of a stored profile, without validating it:
    the other profiles in the store are not this command's business."""
    try:
        extra = json.loads(path.read_text(encoding="utf-8")).get("extra") or {}
        return extra.get("machine"), extra.get("device"), bool(extra.get("quick"))
    except (OSError, ValueError, AttributeError, RecursionError):
        return None, None, False


def machine_profile(machine: Machine | None = None) -> HardwareSpec | None:
    """This machine's profile: the newest full (not --quick) CPU profile `infbench calibrate`
    saved on it, else its cached read-bandwidth probe, else None."""
    machine = machine or this_machine()
    store = profile_dir()
    try:
        files = sorted(store.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:  # no store yet, or a file gone while sorting
        return None
    probe = probe_path(machine)
    for path in files:
        key, device, quick = _stored_machine(path)
        if path != probe and key == machine.key and device == "cpu" and not quick:
            return load_profile(path)
    if probe.is_file():
        try:
            return load_profile(probe)
        except UserError:  # a damaged cache is no measurement: probed again, replaced
            return None
    return None


def _fallback_cpu() -> HardwareSpec:
    """`hardware: auto` before this machine was measured: the `cpu` entry, saying whose."""
    import dataclasses

    entry = HARDWARE["cpu"]
    return dataclasses.replace(
        entry, description=f"{entry.description}: not this machine (hardware auto: no "
                           "calibrated profile or bandwidth probe of it yet; `infbench run` "
                           "probes it, `infbench calibrate` measures it)")


# The profile schema lives in a function: pydantic costs ~150 ms to import, and the
# datasheet path of every analytic command (predict, kv, roofline) never needs it.
_TOP_KEYS = ("name", "description", "peak_flops", "bandwidth", "memory_bytes", "source",
             "kind", "extra", "interconnect")


@functools.cache
def profile_schema() -> tuple[type[BaseModel], type[BaseModel]]:
    """(ProfileSchema, ProfileExtra): the JSON of a hardware profile, as pydantic models.

    ProfileSchema: name, description, peak_flops {dtype: FLOP/s > 0}, bandwidth (bytes/s
    > 0), memory_bytes (> 0), source, kind (gpu | cpu), extra; no other keys.
    ProfileExtra: what `infbench calibrate` writes into `extra`, nothing else.
    """
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
    non_negative = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
    count = Annotated[int, Field(ge=0, strict=True)]
    dtype = Literal["float32", "float16", "bfloat16", "float8", "float4", "int8"]
    curve = list[tuple[positive, positive]]  # type: ignore[valid-type]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class ProfileFigure(Strict):
        repeats: list[positive] = Field(min_length=1)  # type: ignore[valid-type]
        choice: Literal["best", "min"]
        value: positive  # type: ignore[valid-type]
        spread: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, strict=True)]
        rounds: Annotated[int, Field(ge=1, strict=True)]
        flagged: bool

    class ModelSteps(Strict):
        by_tokens: curve  # type: ignore[valid-type]
        decode: list[tuple[positive, positive, positive]]  # type: ignore[valid-type]
        prefill: list[tuple[positive, positive, positive]]  # type: ignore[valid-type]
        timestamp: str
        quick: bool = False

    class ProfileExtra(Strict):
        matmul_flops_by_tokens: dict[dtype, curve] | None = None  # type: ignore[valid-type]
        step_overhead_s: non_negative | None = None  # type: ignore[valid-type]
        layer_overhead_s: non_negative | None = None  # type: ignore[valid-type]
        seq_layer_overhead_s: non_negative | None = None  # type: ignore[valid-type]
        device: Literal["cpu", "cuda"] | None = None
        quick: bool | None = None
        read_bytes_per_s: positive | None = None  # type: ignore[valid-type]
        copy_bytes_per_s: positive | None = None  # type: ignore[valid-type]
        gemv_bytes_per_s: positive | None = None  # type: ignore[valid-type]
        engine_gemv_bytes_per_s: positive | None = None  # type: ignore[valid-type]
        decode_attention_bytes_per_s: positive | None = None  # type: ignore[valid-type]
        prefill_attention_flops_per_s: positive | None = None  # type: ignore[valid-type]
        quant_matmul_flops_by_tokens: dict[  # type: ignore[valid-type]
            QuantizedWeights, curve] | None = None
        engine_backend: Literal["cpu", "torch", "triton"] | None = None
        matmul_stack_bytes: count | None = None  # type: ignore[valid-type]
        attention_stack_bytes: count | None = None  # type: ignore[valid-type]
        last_level_cache_bytes: count | None = None  # type: ignore[valid-type]
        gemv_shape: tuple[count, count] | None = None  # type: ignore[valid-type]
        gemv_dtype: dtype | None = None  # type: ignore[valid-type]
        gemm_flops_per_s: dict[dtype, dict[str, positive]] | None = None  # type: ignore[valid-type]
        buffer_bytes: count | None = None  # type: ignore[valid-type]
        repeats: count | None = None  # type: ignore[valid-type]
        warmup: count | None = None  # type: ignore[valid-type]
        torch_threads: count | None = None  # type: ignore[valid-type]
        torch_version: str | None = None
        allow_tf32: bool | None = None
        timestamp: str | None = None
        figures: dict[str, ProfileFigure] | None = None
        spread_limit: Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)] | None = None
        max_rounds: Annotated[int, Field(ge=1, strict=True)] | None = None
        flags: list[str] | None = None
        machine: str | None = None  # hardware.machine.Machine.key of the calibrated machine
        machine_description: str | None = None
        probe: bool | None = None  # a quick read-bandwidth probe (measure.machine), no more
        # measure/calibrate_model.py: per model key, measured / priced step by token count
        model_steps: dict[str, ModelSteps] | None = None

        @field_validator("matmul_flops_by_tokens")
        @classmethod
        def _curves(cls, value: dict[str, list[tuple[float, float]]] | None
                    ) -> dict[str, list[tuple[float, float]]] | None:
            for name, points in (value or {}).items():
                problem = check_curve(name, [list(p) for p in points])
                if problem:
                    raise ValueError(f"{name}: {problem}")
            return value

    class ProfileSchema(Strict):
        name: str = Field(min_length=1)
        description: str = "calibrated profile"
        peak_flops: dict[dtype, positive] = Field(min_length=1)  # type: ignore[valid-type]
        bandwidth: positive  # type: ignore[valid-type]
        memory_bytes: positive  # type: ignore[valid-type]
        source: str = ""
        kind: Literal["gpu", "cpu"] = "cpu"
        extra: ProfileExtra = Field(default_factory=ProfileExtra)
        # None for what calibrate measures (one device); a hand-written profile may give the
        # `Interconnect` fields to price tensor / pipeline parallelism on it.
        interconnect: dict[str, Any] | None = None

    assert tuple(ProfileSchema.model_fields) == _TOP_KEYS
    return ProfileSchema, ProfileExtra


def _allowed(ctx: dict[str, Any]) -> str:
    return str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")


def _schema_message(err: Any) -> str:
    """One pydantic error -> `key: what is wrong; allowed ...`."""
    parts: list[str] = []
    for p in err["loc"]:
        if isinstance(p, int) and parts:
            parts[-1] += f"[{p}]"
        elif p != "[key]":
            parts.append(str(p))
    key = ".".join(parts) or "(top level)"
    kind, got, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    in_curve = CURVE_KEY in key
    if err["loc"] and err["loc"][-1] == "[key]":
        what = "format" if QUANT_CURVE_KEY in key else "dtype"
        return f"{key}: unknown {what} {got!r}; allowed: {_allowed(ctx)}"
    if kind == "extra_forbidden":
        top, extra = profile_schema()
        model = {"": top, "extra": extra}.get(".".join(parts[:-1]))
        allowed = f"; allowed: {', '.join(model.model_fields)}" if model else ""
        return f"{key}: unknown key{allowed}"
    if kind == "missing":
        return f"{key}: required key is missing"
    if kind == "literal_error":
        return f"{key}: unknown value {got!r}; allowed: {_allowed(ctx)}"
    if kind in ("greater_than", "greater_than_equal", "finite_number", "float_type",
                "float_parsing"):
        op = ">= 0" if kind == "greater_than_equal" or ctx.get("ge") == 0 else "> 0"
        return f"{key}: must be a finite number {op}, got {got!r}"
    if kind == "dict_type":
        what = "dtype -> FLOP/s" if parts == ["peak_flops"] else "key -> value"
        return f"{key}: must be a JSON object ({what}), got {got!r}"
    if in_curve and kind != "value_error":
        return f"{key}: must be a list of [rows, FLOP/s] pairs of finite numbers > 0, got {got!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return f"{key}: {msg}"
    return f"{key}: {msg} (got {got!r})"


def read_profile(path: Path) -> dict[str, Any]:
    """The profile's JSON object, checked against `profile_schema()` (UserError naming the
    file)."""
    text = read_text(path, "hardware profile")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        body = text.strip()
        truncated = body[:1] in "{[" and body[-1:] not in "}]"
        what = "truncated JSON" if truncated else "not JSON"
        raise UserError(f"{path}: not a hardware profile: {what} ({exc.msg}: line "
                        f"{exc.lineno} column {exc.colno}); re-run `infbench calibrate` or "
                        "fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a hardware profile: expected a JSON object with keys "
                        f"{', '.join(_TOP_KEYS)}, got {type(data).__name__}")
    from pydantic import ValidationError

    try:
        profile_schema()[0].model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(f"{path}: invalid hardware profile: {_schema_message(errors[0])}{more}"
                        ) from None
    return data


def _interconnect(data: dict[str, Any] | None) -> Interconnect | None:
    if data is None:
        return None
    link = Interconnect(**data)
    for key in ("link_bytes_per_s", "pcie_bytes_per_s", "network_bytes_per_s"):
        if not _finite(getattr(link, key)):
            raise ConfigError(f"interconnect.{key} must be a finite number > 0 (bytes/s)")
    return link


def load_profile(path: Path) -> HardwareSpec:
    data = read_profile(path)
    extra = dict(data.get("extra") or {})
    check = check_profile(extra)
    if check.errors:
        more = f" (and {len(check.errors) - 1} more)" if len(check.errors) > 1 else ""
        raise UserError(f"{path}: refused hardware profile: {check.errors[0]}{more}; re-run "
                        "`infbench calibrate` on an idle machine")
    flags = merge_flags(extra.get("flags") or [], check.flags)
    if flags:
        extra["flags"] = flags
    try:
        return HardwareSpec(
            name=data["name"],
            description=data.get("description", "calibrated profile"),
            peak_flops={k: float(v) for k, v in data["peak_flops"].items()},
            bandwidth=float(data["bandwidth"]),
            memory_bytes=float(data["memory_bytes"]),
            source=data.get("source", str(path)),
            kind=data.get("kind", "cpu"),
            extra=extra,
            interconnect=_interconnect(data.get("interconnect")),
        )
    except (ConfigError, TypeError) as exc:
        raise UserError(f"{path}: invalid hardware profile: {exc}") from None


def get_hardware(name: str) -> HardwareSpec:
    """A table entry, `auto` (this machine, see `machine_profile`), `local` (the calibrated
    profile) or a path to a profile JSON."""
    key = name.lower()
    if key in HARDWARE:
        return HARDWARE[key]
    if key == AUTO:
        return machine_profile() or _fallback_cpu()
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
        f"unknown hardware {name!r}; allowed: {', '.join(HARDWARE)}, auto, local, or a "
        "profile .json"
    )
