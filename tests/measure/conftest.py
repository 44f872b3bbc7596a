"""Fixtures: realistic fake result files (SmolLM2-shaped decode on the `cpu` hardware entry).

Every number follows from a few parameters, so tests can check derived values exactly:
a decode step moves the fp32 weights (538 MB) plus the batch's KV, prefill is compute-bound,
and `speed` scales every time (speed 0.9 = a run 10% slower in every respect).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infbench.hardware.spec import HARDWARE

WEIGHT_BYTES = 538e6
PARAMS = 135e6
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # layers * (K, V) * kv heads * head dim * fp32
BANDWIDTH = 17e9
PEAK_FP32 = 66e9


def stage(flops: float, nbytes: float, time_s: float, num_steps: int,
          num_tokens: int) -> dict[str, Any]:
    return {
        "flops": flops, "bytes": nbytes, "time_s": time_s, "num_steps": num_steps,
        "num_tokens": num_tokens, "intensity": flops / nbytes,
        "achieved_flops_per_s": flops / time_s, "achieved_bytes_per_s": nbytes / time_s,
        "mbu": nbytes / time_s / BANDWIDTH, "mfu": flops / time_s / PEAK_FP32,
        "time_per_token_s": time_s / num_steps,
    }


def lat(x: float) -> dict[str, float]:
    return {"mean": x * 1.01, "p50": x, "p90": x * 1.02, "p99": x * 1.05}


def fake_metrics(bs: int, prompt_len: int, gen_len: int, speed: float,
                 reference_gbs: float) -> dict[str, Any]:
    prefill_flops = 2 * PARAMS * bs * prompt_len
    prefill_bytes = WEIGHT_BYTES + bs * prompt_len * KV_BYTES_PER_TOKEN
    prefill_time = prefill_flops / 60e9 / speed
    step_flops = 2 * PARAMS * bs
    step_bytes = WEIGHT_BYTES + bs * KV_BYTES_PER_TOKEN * (prompt_len + gen_len // 2)
    step_time = 0.04 * (1 + 0.05 * (bs - 1)) / speed
    n_dec = gen_len - 1
    wall = prefill_time + n_dec * step_time
    tps = bs * gen_len / wall
    return {
        "ttft_s": lat(prefill_time), "tpot_s": lat(step_time * 1.01),
        "itl_s": {"mean": step_time, "p50": step_time, "p90": step_time * 1.1,
                  "p99": step_time * 1.3},
        "e2e_s": lat(wall),
        "output_tokens_per_s": tps, "total_tokens_per_s": bs * (prompt_len + gen_len) / wall,
        "requests_per_s": bs / wall, "prefill_tokens_per_s": bs * prompt_len / prefill_time,
        "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
        "peak_kv_bytes": bs * (prompt_len + gen_len) * KV_BYTES_PER_TOKEN,
        "kv_fragmentation": 0.05, "weight_bytes": int(WEIGHT_BYTES),
        "peak_memory_bytes": int(1.2e9), "num_requests": bs, "num_output_tokens": bs * gen_len,
        "wall_s": wall,
        "prefill": stage(prefill_flops, prefill_bytes, prefill_time, 1, bs * prompt_len),
        "decode": stage(step_flops * n_dec, step_bytes * n_dec, step_time * n_dec, n_dec,
                        bs * n_dec),
        "reference_bytes_per_s": reference_gbs * 1e9,
        "normalized": {"output_tokens_per_s_per_gbs": tps / reference_gbs},
    }


def fake_prediction(bs: int, prompt_len: int, gen_len: int) -> dict[str, Any]:
    pf = 2 * PARAMS * bs * prompt_len
    pb = WEIGHT_BYTES + bs * prompt_len * KV_BYTES_PER_TOKEN
    pt = max(pf / PEAK_FP32, pb / BANDWIDTH)
    df = 2 * PARAMS * bs
    db = WEIGHT_BYTES + bs * KV_BYTES_PER_TOKEN * (prompt_len + gen_len // 2)
    dt = max(df / PEAK_FP32, db / BANDWIDTH)
    return {
        "ttft_s": pt, "tpot_s": dt, "decode_tokens_per_s": bs / dt,
        "output_tokens_per_s": bs * gen_len / (pt + (gen_len - 1) * dt),
        "prefill": {"flops": pf, "bytes": pb, "intensity": pf / pb, "time_s": pt,
                    "bound": "compute"},
        "decode": {"flops": df, "bytes": db, "intensity": df / db, "step_time_s": dt,
                   "time_per_token_s": dt, "bound": "memory"},
        "hardware": "cpu",
    }


def fake_steps(metrics: dict[str, Any], bs: int, prompt_len: int) -> list[dict[str, Any]]:
    pre, dec = metrics["prefill"], metrics["decode"]
    step_time = dec["time_per_token_s"]
    step_flops, step_bytes = dec["flops"] / dec["num_steps"], dec["bytes"] / dec["num_steps"]
    steps = [{"index": 0, "start_s": 0.0, "duration_s": pre["time_s"],
              "num_prefill_tokens": bs * prompt_len, "num_decode_tokens": 0, "num_running": bs,
              "kv_blocks_used": bs * prompt_len // 16, "flops": pre["flops"],
              "bytes": pre["bytes"], "intensity": pre["intensity"], "stage": "prefill"}]
    t = pre["time_s"]
    for i in range(dec["num_steps"]):
        d = step_time * (1 + 0.05 * ((i % 5) - 2))  # deterministic jitter, mean preserved
        steps.append({"index": i + 1, "start_s": t, "duration_s": d, "num_prefill_tokens": 0,
                      "num_decode_tokens": bs, "num_running": bs,
                      "kv_blocks_used": bs * (prompt_len + i + 16) // 16, "flops": step_flops,
                      "bytes": step_bytes, "intensity": step_flops / step_bytes,
                      "stage": "decode"})
        t += d
    for s in steps:
        s["achieved_bytes_per_s"] = s["bytes"] / s["duration_s"]
        s["mbu"] = s["achieved_bytes_per_s"] / BANDWIDTH
        s["mfu"] = s["flops"] / s["duration_s"] / PEAK_FP32
    return steps


def make_result(*, name: str = "smoke", point_index: int = 0, batch_size: int = 4,
                prompt_len: int = 128, gen_len: int = 32, speed: float = 1.0,
                repeat_speeds: tuple[float, ...] = (0.98, 1.0, 1.02),
                reference_gbs: float = 17.0, schema_version: int = 1) -> dict[str, Any]:
    """One result point shaped like infbench.results.build_result's output."""
    args = (batch_size, prompt_len, gen_len)
    repeats = [fake_metrics(*args, speed * s, reference_gbs) for s in repeat_speeds]
    metrics = fake_metrics(*args, speed * statistics.median(repeat_speeds), reference_gbs)
    spread = {}
    for key in ("output_tokens_per_s", "ttft_s.p50", "tpot_s.p50"):
        head, _, tail = key.partition(".")
        vals = [r[head][tail] if tail else r[head] for r in repeats]
        spread[key] = {"min": min(vals), "max": max(vals),
                       "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0}
    label = f"workload.batch_size={batch_size}"
    scenario = {
        "name": name, "index": point_index, "label": label, "source": f"scenarios/{name}.yaml",
        "device": "cpu", "dtype": "float32", "hardware": "cpu",
        "model": {"preset": "smollm2-135m", "overrides": {}},
        "workload": {"kind": "batch", "batch_size": batch_size, "prompt_len": prompt_len,
                     "gen_len": gen_len, "num_requests": batch_size, "rate": None, "seed": 0},
        "engine": {"block_size": 16, "backend": "torch", "max_num_seqs": 64},
        "speculative": {"method": "none"},
        "measure": {"warmup": 1, "repeats": len(repeat_speeds), "profile": "none"},
        "gate": None, "swept": {"workload.batch_size": batch_size},
    }
    return {
        "schema_version": schema_version, "kind": "infbench.run", "name": name, "label": label,
        "point_index": point_index, "scenario": scenario,
        "env": {"device": "cpu", "device_name": "AMD EPYC", "git_sha": "abc123",
                "host": "ci", "backend": "torch"},
        "seed": 0, "hardware": HARDWARE["cpu"].to_dict(), "metrics": metrics,
        "prediction": fake_prediction(*args), "repeats": repeats, "spread": spread,
        "steps": fake_steps(metrics, batch_size, prompt_len),
    }


def write_result(path: Path, result: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path


@pytest.fixture
def fake_result() -> Callable[..., dict[str, Any]]:
    return make_result


@pytest.fixture
def result_file(tmp_path: Path) -> Callable[..., Path]:
    """result_file("base.json", speed=0.9, ...) -> path of a written fake result."""

    def make(filename: str, result: dict[str, Any] | None = None, **kwargs: Any) -> Path:
        return write_result(tmp_path / filename, result or make_result(**kwargs))

    return make
