"""Latency, throughput and memory metrics from the engine's records (numpy, no torch).

Definitions (ARCHITECTURE.md, also in the README):

- TTFT: request arrival -> first output token available.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request with at least 2 tokens.
- ITL: gap between consecutive output tokens of one request; tokens that arrive at
  the same instant (several accepted speculative tokens) share the preceding gap
  divided evenly.  Tokens that arrive together with the first token belong to TTFT.
- E2E: arrival -> last token.  Each latency gets mean, p50, p90 and p99
  (numpy's linear-interpolation percentiles, as vLLM's benchmark scripts use).
- Throughput: output tokens / wall time of the run; also total (prompt + output)
  tokens/s and requests/s.  A prompt sampled n times counts once per sample, like
  its cached tokens.

Metrics that have no samples (TPOT when every request made one token) are None,
never NaN, so result files stay strict JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from infbench.core.metric_names import (  # noqa: F401  (re-exported for callers)
    GATE_METRICS,
    LATENCY_METRICS,
    LATENCY_STATS,
    SCALAR_METRICS,
)
from infbench.engine.records import RequestRecord, StepRecord

# Instants closer than this are "the same instant" (token times come from one clock read).
_SAME_INSTANT_S = 1e-12


def latency_stats(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 of `values` (all None when there are none)."""
    if len(values) == 0:
        return {s: None for s in LATENCY_STATS}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def inter_token_latencies(token_times_s: Sequence[float]) -> list[float]:
    """ITL samples of one request: each token after the first instant gets its share of the gap."""
    out: list[float] = []
    times = list(token_times_s)
    i = 0
    # Skip the tokens that arrived with the first one: their latency is TTFT.
    while i < len(times) and times[i] - times[0] <= _SAME_INSTANT_S:
        i += 1
    prev = times[0] if times else 0.0
    while i < len(times):
        j = i
        while j + 1 < len(times) and times[j + 1] - times[i] <= _SAME_INSTANT_S:
            j += 1
        group = j - i + 1
        out.extend([(times[i] - prev) / group] * group)
        prev = times[i]
        i = j + 1
    return out


def summarize(
    requests: list[RequestRecord],
    steps: list[StepRecord],
    wall_s: float,
    *,
    kv_bytes_per_token: int,
    block_size: int,
    weight_bytes: int,
    peak_memory_bytes: int,
    state_bytes: int = 0,
) -> dict[str, Any]:
    """All metrics of one measured run.

    `state_bytes` is the constant per-sequence state of SSM / linear-attention layers;
    it is counted once per running sequence in the KV peak.
    """
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    done = [r for r in requests if r.num_output_tokens > 0]
    ttft = [r.first_token_s - r.arrival_s for r in done]
    e2e = [r.finish_s - r.arrival_s for r in done]
    tpot = [(r.finish_s - r.first_token_s) / (r.num_output_tokens - 1)
            for r in done if r.num_output_tokens >= 2]
    itl = [gap for r in done for gap in inter_token_latencies(r.token_times_s)]

    num_prompt = sum(r.num_prompt_tokens for r in requests)
    num_output = sum(r.num_output_tokens for r in requests)
    num_cached = sum(r.num_cached_prompt_tokens for r in requests)
    prefill_steps = [s for s in steps if s.num_prefill_tokens > 0]
    prefill_time = sum(s.duration_s for s in prefill_steps)
    prefill_tokens = sum(s.num_prefill_tokens for s in prefill_steps)

    peak_kv, fragmentation = _kv_peak(steps, kv_bytes_per_token, block_size, state_bytes)
    return {
        "ttft_s": latency_stats(ttft),
        "tpot_s": latency_stats(tpot),
        "itl_s": latency_stats(itl),
        "e2e_s": latency_stats(e2e),
        "output_tokens_per_s": num_output / wall_s,
        "total_tokens_per_s": (num_prompt + num_output) / wall_s,
        "requests_per_s": len(requests) / wall_s,
        "prefill_tokens_per_s": prefill_tokens / prefill_time if prefill_time > 0 else None,
        "kv_bytes_per_token": int(kv_bytes_per_token),
        "peak_kv_bytes": peak_kv,
        "kv_fragmentation": fragmentation,
        "weight_bytes": int(weight_bytes),
        "peak_memory_bytes": int(peak_memory_bytes),
        "num_requests": len(requests),
        "num_prompt_tokens": num_prompt,
        "num_output_tokens": num_output,
        "num_steps": len(steps),
        "wall_s": float(wall_s),
        "num_preemptions": sum(s.num_preempted for s in steps),
        "prefix_cache_hit_rate": num_cached / num_prompt if num_prompt > 0 else None,
    }


def _kv_peak(steps: list[StepRecord], kv_bytes_per_token: int, block_size: int,
             state_bytes: int) -> tuple[int, float | None]:
    """Peak allocated KV bytes (whole blocks) and the fragmentation at that step."""
    if not steps:
        return 0, None
    sizes = [(s.kv_blocks_used * block_size * kv_bytes_per_token if s.kv_bytes_used is None
              else s.kv_bytes_used) + s.num_running * state_bytes for s in steps]
    peak = steps[int(np.argmax(sizes))]  # first step reaching the peak
    allocated = peak.kv_blocks_used * block_size
    fragmentation = (allocated - peak.kv_slots_used) / allocated if allocated > 0 else 0.0
    return int(max(sizes)), float(fragmentation)


def aggregate_repeats(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Median of every numeric metric across repeats, and min/max/stdev of the headline ones.

    The spread covers the top-level scalars and the p50 of nested statistics, keyed
    `name` or `name.p50`; stdev is the sample standard deviation (0 for one run).
    """
    if not runs:
        raise ValueError("aggregate_repeats needs at least one run")
    median = _median_tree(runs)
    spread: dict[str, dict[str, float]] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            if "p50" in value:
                _add_spread(spread, f"{key}.p50", [r.get(key, {}).get("p50") for r in runs])
        elif _is_number(value):
            _add_spread(spread, key, [r.get(key) for r in runs])
    return median, spread


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))


def _median_tree(items: list[Any]) -> Any:
    first = next((v for v in items if v is not None), None)
    if isinstance(first, dict):
        keys = list(first)
        keys += [k for item in items[1:] if isinstance(item, dict) for k in item if k not in keys]
        return {k: _median_tree([item.get(k) for item in items if isinstance(item, dict)])
                for k in keys}
    numbers = [v for v in items if _is_number(v)]
    if numbers and len(numbers) == len([v for v in items if v is not None]):
        med = float(np.median(np.asarray(numbers, dtype=np.float64)))
        if all(isinstance(v, (int, np.integer)) for v in numbers) and med.is_integer():
            return int(med)
        return med
    return next((v for v in items if v is not None), None)


def _add_spread(spread: dict[str, dict[str, float]], key: str, values: list[Any]) -> None:
    nums = [float(v) for v in values if _is_number(v)]
    if not nums:
        return
    stdev = statistics.stdev(nums) if len(nums) >= 2 else 0.0
    spread[key] = {"min": min(nums), "max": max(nums), "stdev": stdev}
