"""GPU telemetry: an NVML sampler thread and Nsight Compute DRAM-byte profiling.

Nothing here is imported, needed or failing on a CPU machine: `pynvml` (from the
nvidia-ml-py package) is imported inside `NvmlSampler.start`, and `ncu` is looked
up on the PATH only when a scenario asks for `measure.profile: ncu`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


@dataclass
class NvmlSampler:
    """Samples memory used, GPU utilization, power and SM clock every `interval_s`."""

    device_index: int = 0
    interval_s: float = 0.05
    samples: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> NvmlSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:  # no driver, no package: telemetry is optional
            self.error = f"NVML unavailable: {exc}"
            return self

        def loop() -> None:
            t0 = time.perf_counter()
            while not self._stop.is_set():
                try:
                    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    self.samples.append({
                        "t_s": time.perf_counter() - t0,
                        "memory_used_bytes": float(mem.used),
                        "gpu_util_pct": float(util.gpu),
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                        "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(
                            handle, pynvml.NVML_CLOCK_SM)),
                    })
                except Exception as exc:  # a query the board does not support
                    self.error = f"NVML query failed: {exc}"
                    return
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="infbench-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        return summarize_samples(self.samples, self.error)


def summarize_samples(samples: list[dict[str, float]], error: str | None = None) -> dict[str, Any]:
    """Mean and max of each sampled quantity (what a result file stores)."""
    out: dict[str, Any] = {"num_samples": len(samples)}
    if error:
        out["error"] = error
    keys = [k for k in (samples[0] if samples else {}) if k != "t_s"]
    for k in keys:
        values = [s[k] for s in samples]
        out[k] = {"mean": sum(values) / len(values), "max": max(values)}
    return out


def parse_ncu_csv(text: str) -> dict[str, float]:
    """Sum each DRAM metric over the profiled kernels of `ncu --csv` output (bytes).

    ncu prints one row per (kernel, metric) with "Metric Name", "Metric Unit" and
    "Metric Value" columns; values may carry thousands separators and byte units.
    """
    scale = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
             "KB": 1e3, "MB": 1e6, "GB": 1e9}
    start = text.find('"ID"')
    reader = csv.DictReader(io.StringIO(text[start:] if start >= 0 else text))
    totals = dict.fromkeys(NCU_METRICS, 0.0)
    kernels = set()
    for row in reader:
        name = row.get("Metric Name")
        if name in totals:
            value = float(str(row.get("Metric Value", "0")).replace(",", ""))
            totals[name] += value * scale.get(row.get("Metric Unit", "byte"), 1.0)
            kernels.add(row.get("ID"))
    return {"dram_bytes_read": totals[NCU_METRICS[0]],
            "dram_bytes_write": totals[NCU_METRICS[1]],
            "num_kernels": float(len(kernels))}


def ncu_profile(point_dict: dict[str, Any], num_steps: int = 3) -> dict[str, Any]:
    """Replay a few decode steps under Nsight Compute; DRAM bytes next to accounted bytes.

    Runs `python -m infbench.measure.ncu_probe` under `ncu`, which serves the point's first
    requests to steady decode, then profiles `num_steps` decode steps between
    cudaProfilerStart/Stop and writes the bytes the cost model accounts for them.
    """
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"status": "skipped: ncu (Nsight Compute) is not on the PATH"}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "point.json"
        accounted = Path(tmp) / "accounted.json"
        spec.write_text(json.dumps(point_dict))
        cmd = [ncu, "--csv", "--profile-from-start", "off", "--metrics", ",".join(NCU_METRICS),
               sys.executable, "-m", "infbench.measure.ncu_probe", str(spec), str(accounted),
               str(num_steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ),
                              timeout=1800, check=False)
        if proc.returncode != 0 or not accounted.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"status": f"ncu failed (exit {proc.returncode}): {' | '.join(tail)}"}
        measured = parse_ncu_csv(proc.stdout)
        acc = json.loads(accounted.read_text())
    dram = measured["dram_bytes_read"] + measured["dram_bytes_write"]
    return {"status": "ok", "num_steps": num_steps, **measured,
            "accounted_bytes": acc["bytes"], "dram_over_accounted": dram / acc["bytes"]}
