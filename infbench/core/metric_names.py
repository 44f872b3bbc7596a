"""The names of the measured metrics, defined once: the scenario schema, the metrics code,
reports and the gate all read them from here (core, so the schema can check a gate's
metric without importing the measuring code)."""

from __future__ import annotations

LATENCY_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
LATENCY_STATS = ("mean", "p50", "p90", "p99")
SCALAR_METRICS = (
    "output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "prefill_tokens_per_s",
    "kv_bytes_per_token", "peak_kv_bytes", "kv_fragmentation", "weight_bytes",
    "peak_memory_bytes", "num_requests", "num_prompt_tokens", "num_output_tokens", "num_steps",
    "wall_s", "num_preemptions", "prefix_cache_hit_rate",
)
# Names a CI gate may compare: every scalar and every latency statistic ("ttft_s.p50").
GATE_METRICS = SCALAR_METRICS + tuple(
    f"{m}.{s}" for m in LATENCY_METRICS for s in LATENCY_STATS)
