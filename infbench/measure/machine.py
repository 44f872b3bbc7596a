"""`hardware: auto` on the run path: this machine's profile, probed once when it has none.

A CPU scenario without `hardware:` (`make run`'s quickstart among them) is measured on
this machine, so its MBU and predictions must use this machine's figures, not a built-in
entry measured on another CPU (on a machine that streams 82 GB/s the `cpu` entry's
32 GB/s made every decode MBU read 159%).  `resolve_hardware` takes, in order:

1. the newest full profile `infbench calibrate` saved on this machine (`hardware.spec.
   machine_profile`, matched by `hardware.machine`'s identity);
2. else this machine's cached probe;
3. else it probes now (`probe_machine`: about two seconds on a 2-core CPU): the read
   bandwidth of `x.sum()` over four times the last-level cache (256 MiB .. 1 GiB), the
   same kernel as the same-run reference a run takes beside each repeat, and fp32 / bf16
   GEMMs of a few small sizes for the compute peaks; each a calibrated figure (rounds of
   repeats, `hardware.checks`).  It is cached per machine in the profile store
   (`probe-<machine key>.json`) unless its repeats spread too far (a busy machine is not
   measured: then it serves this run only, and the note says so).

Whichever it takes, one `note:` line per process says what the peak is and where it came
from.  A probe is not a calibration: it has no engine matmul curve, attention rate or
fixed costs, so predictions on it are the plain roofline; `infbench calibrate` measures
those, and `hardware: auto` prefers its profile from then on.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Any

from infbench.core.io import remove_stale_temps, write_json_atomic
from infbench.hardware.checks import MAX_ROUNDS, SPREAD_LIMIT, Figure, check_profile
from infbench.hardware.machine import Machine, this_machine
from infbench.hardware.spec import (
    AUTO,
    HardwareSpec,
    default_hardware,
    get_hardware,
    machine_profile,
    probe_path,
    profile_dir,
)

PROBE_MIN_BYTES = 256 << 20
PROBE_MAX_BYTES = 1 << 30
PROBE_REPEATS = 5
# (sizes, seconds above which a size is not repeated); bf16 is emulated on some CPUs
PROBE_GEMM = {"float32": ((256, 512, 1024), 0.05), "bfloat16": ((256, 512), 0.05)}

_RESOLVED: dict[tuple[str, str], HardwareSpec] = {}


def probe_bytes(llc_bytes: int | None) -> int:
    """The read buffer: four times the last-level cache, within 256 MiB .. 1 GiB."""
    return min(PROBE_MAX_BYTES, max(PROBE_MIN_BYTES, 4 * (llc_bytes or 0)))


def probe_machine(machine: Machine | None = None) -> HardwareSpec:
    """Measure this CPU's read bandwidth and small-GEMM peaks in a couple of seconds, as a
    profile named `auto` (see the module docstring)."""
    import torch

    from infbench.measure.calibrate import (
        device_description,
        gemm_flops,
        memory_capacity,
        read_bandwidth,
    )
    from infbench.measure.calibrate_engine import last_level_cache_bytes
    from infbench.model.dtypes import TORCH_DTYPES

    machine = machine or this_machine()
    nbytes = probe_bytes(last_level_cache_bytes())
    figures: dict[str, Figure] = {"read_bytes_per_s": read_bandwidth("cpu", nbytes,
                                                                     PROBE_REPEATS, 1)}
    per_size: dict[str, dict[int, Figure]] = {}
    for dtype, (sizes, longest) in PROBE_GEMM.items():
        per_size[dtype] = gemm_flops("cpu", TORCH_DTYPES[dtype], sizes, 3, 1, longest)
        figures.update({f"gemm.{dtype}.{n}": f for n, f in per_size[dtype].items()})
    read = figures["read_bytes_per_s"].value
    threads = torch.get_num_threads()
    extra: dict[str, Any] = {
        "device": "cpu", "probe": True, "machine": machine.key,
        "machine_description": machine.describe(),
        "read_bytes_per_s": read,
        "gemm_flops_per_s": {d: {str(n): f.value for n, f in v.items()}
                             for d, v in per_size.items()},
        "buffer_bytes": nbytes, "repeats": PROBE_REPEATS, "torch_threads": threads,
        "torch_version": torch.__version__,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "figures": {k: f.to_dict() for k, f in figures.items()},
        "spread_limit": SPREAD_LIMIT, "max_rounds": MAX_ROUNDS,
    }
    check = check_profile(extra)
    extra["flags"] = check.flags + check.errors
    return HardwareSpec(
        name=AUTO,
        description=f"{device_description('cpu')} ({threads} torch threads), read-bandwidth "
                    "probe of this machine",
        peak_flops={d: max(f.value for f in v.values()) for d, v in per_size.items()},
        bandwidth=read,
        memory_bytes=memory_capacity("cpu"),
        source=f"infbench run's probe: x.sum() over {nbytes >> 20} MiB, best of "
               f"{PROBE_REPEATS} repeats; GEMMs up to {max(PROBE_GEMM['float32'][0])}; "
               "`infbench calibrate` measures the full profile",
        kind="cpu",
        extra=extra,
    )


def _gb(spec: HardwareSpec) -> str:
    return f"{spec.bandwidth / 1e9:.1f} GB/s"


def resolve_hardware(name: str, device: str) -> HardwareSpec:
    """The HardwareSpec a measured point on `device` uses for `hardware: name`; `auto` as
    the module docstring says, with one `note:` line on stderr per process."""
    if name.lower() != AUTO:
        return get_hardware(name)
    if device != "cpu":  # a GPU: the table entry of the GPU NVML names
        return get_hardware(default_hardware(device))
    machine = this_machine()
    key = (machine.key, str(profile_dir()))
    if key in _RESOLVED:
        return _RESOLVED[key]
    spec = machine_profile(machine)
    if spec is not None and not spec.extra.get("probe"):
        note = (f"hardware auto: this machine's calibrated profile {spec.name!r} "
                f"({spec.extra.get('timestamp', 'undated')}): peak read {_gb(spec)}")
    elif spec is not None:
        note = (f"hardware auto: no calibrated profile of this machine ({machine.describe()}); "
                f"MBU and predictions use its read-bandwidth probe, {_gb(spec)} "
                f"({spec.extra.get('timestamp', 'undated')}, {probe_path(machine)}); "
                "`infbench calibrate` measures the full profile, used from then on")
    else:
        start = time.perf_counter()
        spec = probe_machine(machine)
        took = time.perf_counter() - start
        flags = spec.profile_flags
        if flags:
            kept = (f"not cached, the machine was busy ({flags[0]}); the next run probes "
                    "again")
        else:
            path = probe_path(machine)
            remove_stale_temps(path)  # a probe killed while it was being cached
            write_json_atomic(path, asdict(spec), sort_keys=True)
            kept = f"cached in {path}"
        note = (f"hardware auto: no calibrated profile of this machine ({machine.describe()}); "
                f"probed its read bandwidth in {took:.1f} s: {_gb(spec)}, the peak that MBU "
                f"and predictions use ({kept}); `infbench calibrate` measures the full profile, "
                "used from then on")
    print(f"note: {note}", file=sys.stderr)
    _RESOLVED[key] = spec
    return spec
