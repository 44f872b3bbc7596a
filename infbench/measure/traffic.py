"""Traffic accounting of measured steps: bytes moved, FLOPs, MBU and MFU.

Every engine step is priced by the same cost model as `infbench predict`
(`roofline.costs.step_costs`) from the step's real batch composition (each
sequence's new tokens and context), then divided by the step's measured time.
Nothing here touches torch: it runs after the measured loop, on its records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.engine.records import StepRecord
from infbench.hardware.spec import HardwareSpec
from infbench.roofline.costs import SeqWork, step_costs, total


def step_stage(step: StepRecord) -> str:
    if step.num_decode_tokens == 0:
        return "prefill"
    return "decode" if step.num_prefill_tokens == 0 else "mixed"


def annotate_steps(steps: Sequence[StepRecord], cfg: ModelConfig, dtype: str,
                   quant: QuantConfig, hw: HardwareSpec) -> list[dict[str, Any]]:
    """Per step: accounted FLOPs and bytes, achieved FLOP/s and bytes/s, MBU, MFU.

    The roofline's bytes, except an MoE step's routed-expert weights: the bytes of the
    experts its tokens touched (StepRecord.moe) replace uniform routing's expectation."""
    memo: dict[tuple[tuple[int, int, int], ...], tuple[float, float, float, float]] = {}
    peak = hw.peak(dtype)
    rows = []
    for s in steps:
        key = tuple(zip(s.query_lens, s.context_lens,
                        s.logits_lens or [1] * len(s.query_lens), strict=True))
        if key not in memo:
            seqs = [SeqWork(q, c, n) for q, c, n in key]
            t = total(step_costs(cfg, seqs, dtype, quant)) if seqs else None
            memo[key] = ((t.flops, t.bytes, t.weight_bytes, t.kv_read_bytes + t.kv_write_bytes)
                         if t is not None else (0.0, 0.0, 0.0, 0.0))
        flops, nbytes, wbytes, kvbytes = memo[key]
        if s.moe is not None:  # MoE: the experts the step's tokens really touched
            routed = s.moe.expert_bytes - s.moe.expected_bytes  # minus uniform routing's
            nbytes, wbytes = nbytes + routed, wbytes + routed
        dur = max(s.duration_s, 1e-12)
        rows.append({
            "stage": step_stage(s),
            "flops": flops,
            "bytes": nbytes,
            "weight_bytes_read": wbytes,
            "kv_bytes": kvbytes,
            "intensity": flops / nbytes if nbytes else 0.0,
            "achieved_flops_per_s": flops / dur,
            "achieved_bytes_per_s": nbytes / dur,
            "mbu": nbytes / dur / hw.bandwidth,
            "mfu": flops / dur / peak,
        })
    return rows


def stage_traffic(steps: Sequence[StepRecord], costs: Sequence[dict[str, Any]],
                  hw: HardwareSpec, dtype: str) -> dict[str, dict[str, float]]:
    """Aggregate per stage (prefill, decode, mixed): totals, achieved rates, MBU, MFU.

    A stage's achieved bandwidth is its total accounted bytes over its total measured
    time, so long steps weigh more than short ones (the time-weighted mean).
    """
    out: dict[str, dict[str, float]] = {}
    for stage in ("prefill", "decode", "mixed"):
        sel = [(s, c) for s, c in zip(steps, costs, strict=True) if c["stage"] == stage]
        if not sel:
            continue
        flops = sum(c["flops"] for _, c in sel)
        nbytes = sum(c["bytes"] for _, c in sel)
        time_s = sum(s.duration_s for s, _ in sel)
        tokens = sum(s.num_prefill_tokens + s.num_decode_tokens for s, _ in sel)
        t = max(time_s, 1e-12)
        out[stage] = {
            "flops": flops,
            "bytes": nbytes,
            "time_s": time_s,
            "num_steps": len(sel),
            "num_tokens": tokens,
            "intensity": flops / nbytes if nbytes else 0.0,
            "achieved_flops_per_s": flops / t,
            "achieved_bytes_per_s": nbytes / t,
            "mbu": nbytes / t / hw.bandwidth,
            "mfu": flops / t / hw.peak(dtype),
            # decode: one step produces one token per running sequence
            "time_per_token_s": time_s / len(sel),
        }
    return out
