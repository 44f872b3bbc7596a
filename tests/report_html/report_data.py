"""Result files for the HTML report tests, made cheaply from tests/measure's fake results.

`make_result` gives a SmolLM2-shaped point with repeats, steps and a prediction; the
helpers here add what the optional sections read: per-request rows, variants with
accuracy, speculative metrics over k, MoE routing per step, and a rate sweep with SLOs.
Every file validates against the result schema (load_result checks it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from measure.conftest import make_result  # tests/ is on pythonpath (pyproject)


def with_requests(result: dict[str, Any], preempted: int = -1) -> dict[str, Any]:
    """Request rows consistent with the point's TTFT and TPOT (one preempted, if asked)."""
    m = result["metrics"]
    bs = result["scenario"]["workload"]["batch_size"]
    gen = result["scenario"]["workload"]["gen_len"]
    rate = result["scenario"]["workload"].get("rate")
    ttft, tpot = m["ttft_s"]["p50"], m["tpot_s"]["p50"]
    rows = []
    for i in range(bs):
        arrival = i / rate if isinstance(rate, (int, float)) and rate > 0 else 0.0
        first = arrival + ttft * (1 + 0.05 * i)
        itl = [tpot * (1 + 0.1 * ((i + j) % 3 - 1)) for j in range(gen - 1)]
        rows.append({"id": f"r{i:04d}", "arrival_s": arrival, "first_token_s": first,
                     "finish_s": first + sum(itl), "itl_s": itl, "num_prompt_tokens": 128,
                     "num_output_tokens": gen, "num_cached_prompt_tokens": 0,
                     "num_preemptions": 1 if i == preempted else 0, "finish_reason": "length"})
    result["requests"] = rows
    return result


def variant_point(variant: str, batch: int, index: int, speed: float,
                  perplexity: float | None) -> dict[str, Any]:
    r = make_result(name="sweep", point_index=index, batch_size=batch, speed=speed,
                    gen_len=8)
    r["label"] = f"variant={variant},batch_size={batch}"
    r["scenario"]["label"] = r["label"]
    r["scenario"]["swept"] = {"variant": variant, "batch_size": batch}
    if perplexity is not None:
        r["accuracy"] = {"perplexity": perplexity, "reference_perplexity": 10.0,
                         "perplexity_change": perplexity / 10.0 - 1, "greedy_agreement": 0.9,
                         "tokens": 1024}
    return with_requests(r, preempted=1 if batch > 1 else -1)


def spec_point(k: int, index: int) -> dict[str, Any]:
    r = variant_point("ngram", 1, index, 1.0, None)
    r["label"] = f"variant=ngram,speculative.num_tokens={k},batch_size=1"
    r["scenario"]["swept"] = {"variant": "ngram", "speculative.num_tokens": k,
                              "batch_size": 1}
    r["scenario"]["speculative"] = {"method": "ngram", "num_tokens": k}
    accept = [0.8 * 0.7 ** i for i in range(k)]
    r["metrics"]["speculative"] = {
        "method": "ngram", "num_tokens": k, "acceptance_rate": sum(accept) / k,
        "acceptance_per_token": accept[0], "acceptance_by_position": accept,
        "mean_accepted_tokens": 1 + sum(accept), "draft_cost_ratio": 0.05,
        "baseline_tpot_s": 0.05, "baseline_output_tokens_per_s": 20.0,
        "speedup_measured": 1 + 0.3 * k ** 0.5, "speedup_predicted": 1 + 0.35 * k ** 0.5}
    return r


def variants_sweep() -> list[dict[str, Any]]:
    """float32 and int8 variants at batch 1 and 4 with accuracy, n-gram speculation k 1-4."""
    out = [variant_point(v, b, i, speed, ppl) for i, (v, b, speed, ppl) in enumerate(
        [("float32", 1, 1.0, 10.0), ("float32", 4, 1.0, 10.0),
         ("int8", 1, 1.6, 10.2), ("int8", 4, 1.7, 10.2)])]
    out += [spec_point(k, 4 + i) for i, k in enumerate((1, 2, 4))]
    return out


def rate_sweep() -> list[dict[str, Any]]:
    """A rate sweep with objectives on an MoE model: goodput, SLO max rate, routing."""
    out = []
    for i, (rate, attained) in enumerate(((2.0, 1.0), (8.0, 0.95), (32.0, 0.5))):
        r = make_result(name="rates", point_index=i, batch_size=6, gen_len=8,
                        speed=1.0 / (1 + i))
        r["label"] = f"rate={rate:g}"
        r["scenario"]["swept"] = {"rate": rate}
        r["scenario"]["workload"].update(kind="poisson", rate=rate)
        r["scenario"]["measure"]["slo"] = {"ttft_ms": 2000.0, "tpot_ms": 60.0, "target": 0.9}
        r["metrics"].update(goodput_requests_per_s=rate * attained, slo_attainment=attained,
                            num_slo_met=6 * attained)
        r["metrics"]["moe"] = {"steps": 8, "experts_touched_per_step": 30.0,
                               "expected_experts_per_step": 32.0, "expert_bytes": 3.0e8,
                               "expected_expert_bytes": 3.2e8, "expert_bytes_error_pct": -6.25,
                               "max_over_mean": 2.5, "cv": 0.6}
        for j, step in enumerate(r["steps"]):
            step["moe"] = {"num_tokens": 6, "experts_touched": 28 + j % 5,
                           "expected_experts": 30.5, "max_over_mean": 2.0 + 0.1 * (j % 4),
                           "cv": 0.5}
        out.append(with_requests(r))
    return out


def engine_run() -> list[dict[str, Any]]:
    return [with_requests(make_result(name="smoke", point_index=i, batch_size=b, gen_len=8))
            for i, b in enumerate((1, 4))]


def write_run(directory: Path, results: list[dict[str, Any]]) -> Path:
    """A run directory without a manifest (readers take every *.json)."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in results:
        (directory / f"{r['name']}_{r['point_index']:03d}.json").write_text(json.dumps(r))
    return directory
