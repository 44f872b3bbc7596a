"""`infbench kv --results`: what each run allocated next to what the analytic model predicts.

It lives in `results` (not in the analytic package) because it reads result files, and
every number it reads goes through the one accessor (`results.accessor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.hardware.spec import HardwareSpec
from infbench.results.accessor import metric, scenario_number
from infbench.roofline.analysis import max_batch
from infbench.roofline.shapes import kv_bytes_per_token, kv_cache_bytes, state_bytes_per_seq
from infbench.roofline.tables import scheme_name


def kv_measured_rows(results: Sequence[dict[str, Any]], hw: HardwareSpec) -> list[dict[str, Any]]:
    """Predicted KV at the run's context (prompt + gen) and batch, measured peak KV
    allocated by the paged cache (whole blocks, so it rounds up), exact bytes per token and
    per-sequence state, and measured decode speed and TTFT (None where a run has none).
    """
    rows = []
    for r in results:
        cfg = ModelConfig.from_dict(r["model_config"])
        sc = r["scenario"]
        dtype = sc["dtype"]
        quant = QuantConfig(**(sc["model"].get("quant") or {}))
        context = int(scenario_number(r, "workload.prompt_len") or 0) + int(
            scenario_number(r, "workload.gen_len") or 0)
        size_key = "batch_size" if sc["workload"]["kind"] == "static" else "num_requests"
        batch = int(scenario_number(r, f"workload.{size_key}") or 0)
        decode_time = metric(r, "decode.time_per_token_s")
        rows.append({
            "label": r.get("label", ""),
            "model": cfg.name,
            "dtype": dtype,
            "attention": cfg.attention.kind,
            "scheme": scheme_name(cfg),
            "kv_bytes_per_token_predicted": kv_bytes_per_token(cfg, dtype, quant),
            "kv_bytes_per_token_measured": metric(r, "kv_bytes_per_token"),
            "state_bytes_per_seq_predicted": state_bytes_per_seq(cfg, dtype),
            "state_bytes_per_seq_measured": metric(r, "state_bytes_per_seq") or 0,
            "kv_cache_bytes_predicted": kv_cache_bytes(cfg, dtype, quant, context, batch),
            "peak_kv_bytes_measured": metric(r, "peak_kv_bytes"),
            "max_batch_predicted": max_batch(cfg, hw, dtype, quant, context),
            "decode_tokens_per_s_measured": batch / decode_time if decode_time else None,
            "ttft_p50_s_measured": metric(r, "ttft_s.p50"),  # None without p50
            "context_len": context,
            "batch": batch,
        })
    return rows
