"""Goodput: requests per second that meet every latency objective (vLLM's definition).

Pure functions over request rows (the dicts `metrics.request_rows` writes into every
result, `result["requests"]`), so the in-process benchmark and any other client that
records the same rows compute the same numbers.  For each request:

- TTFT = first token - arrival, E2E = last token - arrival;
- TPOT = (E2E - TTFT) / (output tokens - 1), and 0 for a single-token output (vLLM's
  benchmark client does the same, so such a request meets any TPOT objective);
- it is *good* when it produced at least one token and every objective given is met
  (value <= objective; objectives in milliseconds, as vLLM's `--goodput ttft:200`).

`goodput_requests_per_s` = good requests / the run's wall time (vLLM divides by the
benchmark duration); `slo_attainment` = good requests / all requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infbench.scenario.measure import SloSection


def request_latencies_ms(row: Mapping[str, Any]) -> dict[str, float] | None:
    """TTFT, TPOT and E2E of one request row in milliseconds; None if it made no token."""
    count = int(row["num_output_tokens"])
    if count <= 0 or row.get("first_token_s") is None or row.get("finish_s") is None:
        return None
    ttft = (row["first_token_s"] - row["arrival_s"]) * 1e3
    e2e = (row["finish_s"] - row["arrival_s"]) * 1e3
    tpot = (e2e - ttft) / (count - 1) if count > 1 else 0.0
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}


def meets_slo(row: Mapping[str, Any], slo: SloSection) -> bool:
    """Whether one request met every objective of `slo` that is set."""
    latencies = request_latencies_ms(row)
    if latencies is None:
        return False
    return all(getattr(slo, key) is None or latencies[key] <= getattr(slo, key)
               for key in ("ttft_ms", "tpot_ms", "e2e_ms"))


def goodput_metrics(rows: Sequence[Mapping[str, Any]], slo: SloSection,
                    wall_s: float, num_failed: int = 0) -> dict[str, Any]:
    """`goodput_requests_per_s`, `slo_attainment` and `num_slo_met` of one run.
    `num_failed` requests that never finished (a server's errors) meet no SLO: they count
    in the attainment's denominator."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    good = sum(meets_slo(r, slo) for r in rows)
    total = len(rows) + num_failed
    return {
        "goodput_requests_per_s": good / wall_s,
        "slo_attainment": good / total if total else None,
        "num_slo_met": good,
    }
