"""The names of the measured metrics, defined once: the scenario schema, the metrics code,
reports and the gate all read them from here (core, so the schema can check a gate's
metric without importing the measuring code).

Latency statistics are `mean` plus one `p<number>` key per configured percentile
(`measure.percentiles`, default 50, 90, 95, 99): `p50`, `p99.9`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

LATENCY_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
# Reasoning models (a client run whose stream carried reasoning tokens): TTFO, time to the
# first output (content) token, beside TTFT (the first token of any kind), with the same
# statistics, and the reasoning tokens among num_output_tokens.  Absent from other results,
# so they are not among LATENCY_METRICS / SCALAR_METRICS, which every result carries; the
# accessor and the gate read them from the schema (`ttfo_s.p50`).
TTFO_METRIC = "ttfo_s"
NUM_REASONING_TOKENS = "num_reasoning_tokens"
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
SCALAR_METRICS = (
    "output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "prefill_tokens_per_s",
    "kv_bytes_per_token", "peak_kv_bytes", "kv_fragmentation", "weight_bytes",
    "peak_memory_bytes", "num_requests", "num_prompt_tokens", "num_output_tokens", "num_steps",
    "wall_s", "num_preemptions", "prefix_cache_hit_rate",
)
# The metrics whose run-to-run variation `metrics.noise` reports (coefficient of variation).
HEADLINE_METRICS = ("output_tokens_per_s", "total_tokens_per_s", "ttft_s.p50", "tpot_s.p50",
                    "itl_s.p50", "e2e_s.p50")
# p50, p99.9: digits with at most one decimal point, no sign or exponent.
_PERCENTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)$")


def percentile_key(q: float) -> str:
    """`p50` for 50, `p99.9` for 99.9: the shortest decimal that reads back as `q`."""
    if not (math.isfinite(q) and 0 < q <= 100):
        raise ValueError(f"percentile must be in (0, 100], got {q!r}")
    if float(q).is_integer():
        return f"p{int(q)}"
    text = repr(float(q))
    if "e" in text:  # 1e-05: spell it out so the key stays p<digits>
        text = f"{q:.20f}".rstrip("0")
    return f"p{text}"


def latency_stats_names(percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> tuple[str, ...]:
    """The keys of one latency statistic: mean, then one per percentile in the given order."""
    return ("mean", *(percentile_key(q) for q in percentiles))


def is_stat_name(name: str) -> bool:
    """`mean` or a percentile key `p<number>` with the number in (0, 100]."""
    if name == "mean":
        return True
    match = _PERCENTILE_KEY.match(name)
    return match is not None and 0 < float(match.group(1)) <= 100


LATENCY_STATS = latency_stats_names()
# Names a CI gate may compare with the default percentiles: every scalar and every latency
# statistic ("ttft_s.p95"); `is_gate_metric` also accepts any other percentile key.
GATE_METRICS = SCALAR_METRICS + tuple(
    f"{m}.{s}" for m in LATENCY_METRICS for s in LATENCY_STATS)


def is_gate_metric(name: str) -> bool:
    """A scalar, a latency (its p50), or a latency statistic with any valid percentile key."""
    if name in SCALAR_METRICS or name in LATENCY_METRICS:
        return True
    head, dot, stat = name.partition(".")
    return bool(dot) and head in LATENCY_METRICS and is_stat_name(stat)
