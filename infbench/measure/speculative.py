"""Speculative decoding metrics: acceptance from the step records, the speed-up measured
against the same workload decoded plainly in the same invocation, and the speed-up the
standard model predicts from the measured acceptance and draft cost.

Per verification the engine records the drafts proposed (k_i) and accepted (a_i); a step
emits a_i + 1 tokens for that sequence.  From them:

- `acceptance_rate`: accepted / proposed drafts (vLLM's draft acceptance rate).
- `acceptance_by_position[j-1]`: P(draft j accepted | draft j proposed and drafts 1..j-1
  accepted), the conditional rate at each position.
- `acceptance_per_token` a: accepted / (accepted + rejections), each verification that
  stopped before its last draft counting one rejection: the maximum-likelihood a of the
  i.i.d. model that the prediction assumes.
- `mean_accepted_tokens`: tokens emitted per verification, (sum a_i + n) / n (the bonus or
  correction token included, as vLLM's mean acceptance length).
- `draft_cost_ratio` c: the proposer's time per draft token over the mean plain decode
  step of the baseline run (same batch, same invocation).
- `speedup_predicted` = (1 - a^(k+1)) / ((1 - a)(k c + 1)) (Leviathan et al.) with k the
  mean drafts per verification; `speedup_measured` = baseline TPOT / speculative TPOT
  (means over requests), with output tokens/s beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infbench.engine.records import StepRecord


def acceptance(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """Acceptance statistics of one run's steps (empty dict: nothing was verified)."""
    drafts = [d for s in steps for d in s.spec_drafts]
    accepted = [a for s in steps for a in s.spec_accepted]
    n = len(drafts)
    if n == 0:
        return {"num_verifications": 0, "num_draft_tokens": 0}
    proposed, kept = sum(drafts), sum(accepted)
    rejections = sum(1 for d, a in zip(drafts, accepted, strict=True) if a < d)
    by_position = []
    for j in range(1, max(drafts) + 1):
        reached = sum(1 for d, a in zip(drafts, accepted, strict=True) if d >= j and a >= j - 1)
        ok = sum(1 for a in accepted if a >= j)
        by_position.append(ok / reached if reached else None)
    return {
        "num_verifications": n,
        "num_draft_tokens": proposed,
        "num_accepted_tokens": kept,
        "acceptance_rate": kept / proposed if proposed else None,
        "acceptance_per_token": kept / (kept + rejections) if kept + rejections else None,
        "acceptance_by_position": by_position,
        "mean_draft_tokens": proposed / n,
        "mean_accepted_tokens": (kept + n) / n,
        "draft_time_s": sum(s.draft_time_s for s in steps),
        "num_draft_steps": sum(1 for s in steps if s.spec_drafts),
    }


def plain_decode_step_s(steps: Sequence[StepRecord]) -> float | None:
    """Mean duration of the steps that only decoded (no prefill tokens)."""
    decode = [s.duration_s for s in steps if s.num_prefill_tokens == 0 and s.num_decode_tokens]
    return sum(decode) / len(decode) if decode else None


def predicted_speedup(a: float, k: float, c: float) -> float:
    """(1 - a^(k+1)) / ((1 - a)(k c + 1)); a = 1 gives (k + 1) / (k c + 1)."""
    gain = k + 1 if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
    return gain / (k * c + 1)


def compare(spec: dict[str, Any], spec_metrics: dict[str, Any],
            base_metrics: dict[str, Any], base_step_s: float | None) -> dict[str, Any]:
    """The speed-up side: measured against the plain run, predicted from a and c."""
    out: dict[str, Any] = {}
    tpot_spec = (spec_metrics.get("tpot_s") or {}).get("mean")
    tpot_base = (base_metrics.get("tpot_s") or {}).get("mean")
    out["baseline_tpot_s"] = tpot_base
    out["baseline_output_tokens_per_s"] = base_metrics.get("output_tokens_per_s")
    out["speedup_measured"] = (tpot_base / tpot_spec
                               if tpot_base and tpot_spec else None)
    base_tps = base_metrics.get("output_tokens_per_s")
    out["throughput_ratio"] = (spec_metrics["output_tokens_per_s"] / base_tps
                               if base_tps else None)
    out["baseline_decode_step_s"] = base_step_s
    k = spec.get("mean_draft_tokens")
    a = spec.get("acceptance_per_token")
    steps = spec.get("num_draft_steps") or 0
    c = None
    if base_step_s and k and steps:
        c = spec["draft_time_s"] / steps / k / base_step_s
    out["draft_cost_ratio"] = c
    out["speedup_predicted"] = (predicted_speedup(a, k, c)
                                if a is not None and k and c is not None else None)
    return out
