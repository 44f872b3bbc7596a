"""Latency, throughput and memory metrics from the engine's records (numpy, no torch).

Each metric is computed here and nowhere else ([Results and metrics](docs/results.md)):

- TTFT: request arrival -> first output token available.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request with at least 2 tokens.
- ITL: gap between consecutive output tokens of one request; tokens that arrive at
  the same instant (several accepted speculative tokens) share the preceding gap
  divided evenly.  Tokens that arrive together with the first token belong to TTFT.
- E2E: arrival -> last token.  Each latency gets its mean and the configured
  percentiles (`measure.percentiles`, keys `p50`, `p99.9`; numpy's
  linear-interpolation percentiles, as vLLM's benchmark scripts use).
- Throughput: output tokens / wall time of the run; also total (prompt + output)
  tokens/s and requests/s.  A prompt sampled n times counts once per sample, like
  its cached tokens.

The latencies are computed from per-request rows (`request_rows`), which every result
stores, so `from_request_rows` recomputes them later with any percentiles.  Metrics that
have no samples (TPOT when every request made one token) are None, never NaN, so result
files stay strict JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from infbench.core.metric_names import (  # noqa: F401  (re-exported for callers)
    DEFAULT_PERCENTILES,
    GATE_METRICS,
    HEADLINE_METRICS,
    LATENCY_METRICS,
    LATENCY_STATS,
    NUM_REASONING_TOKENS,
    SCALAR_METRICS,
    TTFO_METRIC,
    latency_stats_names,
    percentile_key,
)
from infbench.engine.records import RequestRecord, StepRecord

# Instants closer than this are "the same instant" (token times come from one clock read).
_SAME_INSTANT_S = 1e-12
# Noise warnings: a headline metric varying more than this over repeats (stdev / mean) ...
MAX_CV = 0.10
# ... or the same-run reference bandwidth this far from the hardware profile's bandwidth.
MAX_REFERENCE_DEVIATION = 0.30


def latency_stats(values: Sequence[float],
                  percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float | None]:
    """mean and the `percentiles` of `values`, keyed mean, p50, ... (all None when empty)."""
    keys = latency_stats_names(percentiles)
    if len(values) == 0:
        return {k: None for k in keys}
    arr = np.asarray(values, dtype=np.float64)
    qs = np.percentile(arr, list(percentiles))  # linear interpolation (numpy's default)
    return {"mean": float(arr.mean()),
            **{k: float(v) for k, v in zip(keys[1:], qs, strict=True)}}


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


def request_rows(requests: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """One plain row per request (`result["requests"]`): times in seconds from the run start.

    A request that streamed reasoning tokens also carries `num_reasoning_tokens` and
    `first_output_s` (its first content token; None when none came), which TTFO reads."""
    return [_with_reasoning(r, {
        "id": r.request_id,
        "arrival_s": float(r.arrival_s),
        "first_token_s": float(r.first_token_s) if r.num_output_tokens else None,
        "finish_s": float(r.finish_s) if r.num_output_tokens else None,
        "itl_s": inter_token_latencies(r.token_times_s),
        "num_prompt_tokens": int(r.num_prompt_tokens),
        "num_output_tokens": int(r.num_output_tokens),
        "num_cached_prompt_tokens": int(r.num_cached_prompt_tokens),
        "num_preemptions": int(r.num_preemptions),
        "finish_reason": r.finish_reason,
    }) for r in requests]


def _with_reasoning(record: RequestRecord, row: dict[str, Any]) -> dict[str, Any]:
    if record.num_reasoning_tokens:  # only then: rows of other requests stay as they were
        row["num_reasoning_tokens"] = int(record.num_reasoning_tokens)
        row["first_output_s"] = None if record.first_output_s is None else \
            float(record.first_output_s)
    return row


def time_to_first_output(rows: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """TTFO samples (arrival -> first content token) when any request streamed reasoning,
    else None (then TTFO is TTFT and no `ttfo_s` is reported).  A request without reasoning
    counts its TTFT; one that reasoned and never produced content has no sample."""
    if not any(r.get(NUM_REASONING_TOKENS) for r in rows):
        return None
    out = []
    for r in rows:
        if r["num_output_tokens"] <= 0:
            continue
        if not r.get("num_reasoning_tokens"):
            out.append(r["first_token_s"] - r["arrival_s"])
        elif r.get("first_output_s") is not None:
            out.append(r["first_output_s"] - r["arrival_s"])
    return out


def from_request_rows(rows: Sequence[Mapping[str, Any]],
                      percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                      wall_s: float | None = None) -> dict[str, Any]:
    """TTFT, TPOT, ITL and E2E statistics of `rows` (as stored in `result["requests"]`).

    With `wall_s` (the run's `metrics.wall_s`) also the output / total tokens/s and
    requests/s.  `summarize` calls this, so a result's rows give back its metrics exactly.
    """
    done = [r for r in rows if r["num_output_tokens"] > 0]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in done]
    e2e = [r["finish_s"] - r["arrival_s"] for r in done]
    # (E2E - TTFT) / (n - 1) written as (finish - first) / (n - 1): the same number exactly.
    tpot = [(r["finish_s"] - r["first_token_s"]) / (r["num_output_tokens"] - 1)
            for r in done if r["num_output_tokens"] >= 2]
    itl = [gap for r in done for gap in r["itl_s"]]
    out: dict[str, Any] = {
        "ttft_s": latency_stats(ttft, percentiles),
        "tpot_s": latency_stats(tpot, percentiles),
        "itl_s": latency_stats(itl, percentiles),
        "e2e_s": latency_stats(e2e, percentiles),
    }
    ttfo = time_to_first_output(rows)
    if ttfo is not None:  # a reasoning model's run: time to the first content token too
        out[TTFO_METRIC] = latency_stats(ttfo, percentiles)
    if wall_s is not None:
        if wall_s <= 0:
            raise ValueError(f"wall_s must be > 0, got {wall_s}")
        num_prompt = sum(r["num_prompt_tokens"] for r in rows)
        num_output = sum(r["num_output_tokens"] for r in rows)
        out["output_tokens_per_s"] = num_output / wall_s
        out["total_tokens_per_s"] = (num_prompt + num_output) / wall_s
        out["requests_per_s"] = len(rows) / wall_s
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
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """All metrics of one measured run (latency statistics: mean and `percentiles`).

    `state_bytes` is the constant per-sequence state of SSM / linear-attention layers;
    it is counted once per running sequence in the KV peak.
    """
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    num_prompt = sum(r.num_prompt_tokens for r in requests)
    num_output = sum(r.num_output_tokens for r in requests)
    num_cached = sum(r.num_cached_prompt_tokens for r in requests)
    prefill_steps = [s for s in steps if s.num_prefill_tokens > 0]
    prefill_time = sum(s.duration_s for s in prefill_steps)
    prefill_tokens = sum(s.num_prefill_tokens for s in prefill_steps)

    peak_kv, fragmentation = _kv_peak(steps, kv_bytes_per_token, block_size, state_bytes)
    return {
        **from_request_rows(request_rows(requests), percentiles, wall_s),
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
    `name` or `name.p50`, and the same of `window` (measure.window), keyed `window.name`;
    stdev is the sample standard deviation (0 for one run).
    """
    if not runs:
        raise ValueError("aggregate_repeats needs at least one run")
    median = _median_tree(runs)
    spread: dict[str, dict[str, float]] = {}
    _spread_of(spread, runs, "")
    if isinstance(runs[0].get("window"), dict):
        _spread_of(spread, [r.get("window") or {} for r in runs], "window.")
    return median, spread


def _spread_of(spread: dict[str, dict[str, float]], runs: list[dict[str, Any]],
               prefix: str) -> None:
    for key, value in runs[0].items():
        if isinstance(value, dict):
            if "p50" in value:
                _add_spread(spread, f"{prefix}{key}.p50",
                            [r.get(key, {}).get("p50") for r in runs])
        elif _is_number(value):
            _add_spread(spread, prefix + key, [r.get(key) for r in runs])


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
        if all(isinstance(v, (int, np.integer)) for v in numbers):
            # a count stays a count: between two middle repeats (an even number of them,
            # e.g. decode steps 10 and 11) the lower one, a value some repeat had
            return int(med) if med.is_integer() else int(sorted(numbers)[(len(numbers) - 1) // 2])
        return med
    return next((v for v in items if v is not None), None)


def _add_spread(spread: dict[str, dict[str, float]], key: str, values: list[Any]) -> None:
    nums = [float(v) for v in values if _is_number(v)]
    if not nums:
        return
    stdev = statistics.stdev(nums) if len(nums) >= 2 else 0.0
    spread[key] = {"min": min(nums), "max": max(nums), "stdev": stdev}


def _lookup(tree: Mapping[str, Any], path: str) -> float | None:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return float(node) if _is_number(node) else None


def noise(runs: Sequence[Mapping[str, Any]], *, reference_bytes_per_s: float | None = None,
          hardware_bandwidth: float | None = None, hardware_name: str = "") -> dict[str, Any]:
    """`metrics.noise`: how much the headline metrics vary over repeats, and warnings.

    cv: the coefficient of variation (sample stdev / mean) of each HEADLINE_METRICS entry
    over the repeats; None with fewer than 2 repeats, when a repeat lacks the value (p50
    not among the configured percentiles) or when the mean is not > 0.  A warning names
    each CV above MAX_CV, and a same-run reference bandwidth (when one was measured) more
    than MAX_REFERENCE_DEVIATION away from the hardware profile's bandwidth.
    """
    cv: dict[str, float | None] = {}
    warnings: list[str] = []
    for name in HEADLINE_METRICS:
        values = [_lookup(r, name) for r in runs]
        nums = [v for v in values if v is not None]
        if len(nums) < 2 or len(nums) != len(values) or statistics.fmean(nums) <= 0:
            cv[name] = None
            continue
        value = cv[name] = statistics.stdev(nums) / statistics.fmean(nums)
        if value > MAX_CV:
            warnings.append(
                f"{name} varies by {value:.1%} over {len(nums)} repeats (stdev/mean > "
                f"{MAX_CV:.0%}): the machine is noisy; add repeats or gate with "
                "normalize: reference")
    deviation = None
    if reference_bytes_per_s and hardware_bandwidth:
        deviation = reference_bytes_per_s / hardware_bandwidth - 1
        if abs(deviation) > MAX_REFERENCE_DEVIATION:
            warnings.append(
                f"same-run reference bandwidth {reference_bytes_per_s / 1e9:.3g} GB/s is "
                f"{abs(deviation):.0%} {'below' if deviation < 0 else 'above'} hardware "
                f"{hardware_name!r} ({hardware_bandwidth / 1e9:.3g} GB/s): the profile does not "
                "describe this machine as it runs now, so MBU and predictions are off; "
                "choose the matching hardware or run `infbench calibrate` (hardware: local)")
    if hardware_bandwidth:
        warnings += mbu_reasons(runs, hardware_bandwidth, hardware_name, reference_bytes_per_s,
                                deviation is not None and deviation > MAX_REFERENCE_DEVIATION)
    return {"cv": cv, "warnings": warnings}


def mbu_reasons(runs: Sequence[Mapping[str, Any]], hardware_bandwidth: float,
                hardware_name: str, reference_bytes_per_s: float | None = None,
                is_foreign: bool = False) -> list[str]:
    """One warning per stage whose MBU (median over the repeats) is above 100%, saying why:
    a profile of another machine (`is_foreign`: the same-run reference read well above the
    profile's bandwidth; MBU against that reference is given beside it), or bytes moved
    faster than the profile's peak (a cache held part of them, or the peak is a plain
    read slower than the engine's own kernels stream).  A result never shows MBU above
    100% without its reason."""
    out = []
    for stage in ("prefill", "decode", "mixed"):
        values = [_lookup(r, f"{stage}.mbu") for r in runs]
        nums = [v for v in values if v is not None]
        if not nums or statistics.median(nums) <= 1.0:
            continue
        mbu = statistics.median(nums)
        peak = f"hardware {hardware_name!r}'s {hardware_bandwidth / 1e9:.3g} GB/s"
        if is_foreign and reference_bytes_per_s:
            against = mbu * hardware_bandwidth / reference_bytes_per_s
            out.append(f"{stage} MBU {mbu:.0%} is above 100% because {peak} is not this "
                       "machine's bandwidth: against the same-run reference read of "
                       f"{reference_bytes_per_s / 1e9:.3g} GB/s it is {against:.0%}; use "
                       "`hardware: auto` (this machine) or run `infbench calibrate`")
        else:
            out.append(f"{stage} MBU {mbu:.0%} is above 100%: the {stage} steps moved the "
                       f"bytes the cost model counts faster than {peak}, so part of them "
                       "came from a cache (weights or KV that fit the last-level cache) or "
                       "the peak is a plain read slower than the engine's kernels stream; "
                       "`infbench calibrate` measures the engine's own GEMV rate and takes "
                       "the higher")
    return out
