"""The simulated engine: the engine's scheduler decides, the cost model times each step.

Checked against what must hold whatever the timings: one wave of identical requests is the
roofline's TTFT and TPOT; the same seed gives the same records; queueing grows with the
rate; prefix hits, preemption, the client cap, forks and speculative acceptance behave as
in the engine."""

from __future__ import annotations

from typing import Any

import pytest

from infbench.core.config import QuantConfig
from infbench.hardware.spec import get_hardware
from infbench.measure.simulation import point_requests, sim_config, simulate_point
from infbench.roofline.analysis import predict
from infbench.scenario.schema import scenario_from_document
from infbench.sim.engine_sim import simulate
from infbench.sim.step_cost import make_pricer

HW = get_hardware("h100-sxm")


def _point(workload: dict[str, Any], engine: dict[str, Any] | None = None,
           **top: Any) -> Any:
    doc = {"name": "sim", "model": {"preset": "llama3-8b"}, "hardware": "h100-sxm",
           "dtype": "bfloat16", "workload": workload, "engine": engine or {}, **top}
    return scenario_from_document(doc, "sim.yaml").points()[0]


def _run(point: Any) -> Any:
    return simulate_point(point, point.model_config(), HW)


def test_one_wave_of_identical_requests_is_the_roofline() -> None:
    point = _point({"kind": "static", "batch_size": 8, "prompt_len": 256, "gen_len": 16})
    m = _run(point).metrics
    p = predict(point.model_config(), HW, batch=8, prompt_len=256, gen_len=16,
                dtype="bfloat16")
    assert m["num_requests"] == 8 and m["num_output_tokens"] == 8 * 16
    assert m["ttft_s"]["p50"] == pytest.approx(p.ttft_s, rel=1e-9)  # one prefill step
    # the 15 decode steps feed tokens 1..15 at contexts 257..271: the roofline's mean over
    # exactly those contexts (predict's own mean runs one context further, to 272)
    steps = predict(point.model_config(), HW, batch=8, prompt_len=256, gen_len=15,
                    dtype="bfloat16").decode.time_s
    assert m["tpot_s"]["p50"] == pytest.approx(steps, rel=1e-9)
    assert m["tpot_s"]["p50"] == pytest.approx(p.time_per_token_s, rel=1e-4)
    assert m["e2e_s"]["p50"] == pytest.approx(p.ttft_s + 15 * steps, rel=1e-9)
    assert m["num_steps"] == 16 and m["num_preemptions"] == 0


def test_deterministic_for_a_seed_and_the_rate_moves_queueing() -> None:
    def at(rate: float, seed: int = 0) -> dict[str, Any]:
        return _run(_point({"kind": "poisson", "rate": rate, "num_requests": 120,
                            "prompt_len": 512, "gen_len": 32, "prompt_len_dist": "uniform",
                            "gen_len_dist": "uniform", "len_spread": 0.5, "seed": seed},
                           {"max_num_seqs": 64}))

    low, again, high = at(2.0), at(2.0), at(400.0)
    assert low.metrics == again.metrics and low.rows == again.rows
    assert at(2.0, seed=1).rows != low.rows
    # light load: a request waits for nothing but its own prefill, beside a few decodes
    single = predict(_point({"kind": "static", "prompt_len": 512, "gen_len": 2}
                            ).model_config(), HW, batch=1, prompt_len=512, gen_len=2,
                     dtype="bfloat16").ttft_s
    assert low.metrics["ttft_s"]["p50"] < 3 * single
    assert high.metrics["ttft_s"]["p90"] > 20 * low.metrics["ttft_s"]["p90"]  # queueing
    assert high.metrics["output_tokens_per_s"] > 5 * low.metrics["output_tokens_per_s"]


def test_prefix_cache_hits_and_their_prefill_savings() -> None:
    workload = {"kind": "offline", "num_requests": 32, "prompt_len": 600, "gen_len": 8,
                "shared_prefix_len": 512}
    cached = _run(_point(workload, {"max_num_seqs": 4})).metrics
    cold = _run(_point(workload, {"max_num_seqs": 4, "enable_prefix_caching": False})).metrics
    assert cached["prefix_cache_hit_rate"] > 0.7 and cold["prefix_cache_hit_rate"] == 0
    assert cached["ttft_s"]["p50"] < cold["ttft_s"]["p50"]


def test_a_small_kv_pool_preempts_and_still_finishes() -> None:
    # 64 sequences of 1,100 tokens against a pool of ~20,000 tokens: recompute preemption
    point = _point({"kind": "offline", "num_requests": 64, "prompt_len": 100, "gen_len": 1000},
                   {"max_num_seqs": 64, "kv_cache_memory": 20_000 * 131072})
    m = _run(point).metrics
    assert m["num_preemptions"] > 0 and m["num_requests"] == 64
    assert m["num_output_tokens"] == 64 * 1000


def test_client_cap_forks_and_speculation() -> None:
    capped = _point({"kind": "offline", "num_requests": 12, "prompt_len": 64, "gen_len": 8,
                     "max_concurrency": 3})
    cfg = capped.model_config()
    requests, _ = point_requests(capped, cfg)
    pricer = make_pricer(cfg, HW, "bfloat16", QuantConfig())
    out = simulate(requests, pricer, sim_config(capped, cfg, HW, QuantConfig(), requests, None),
                   realtime_arrivals=False, max_concurrency=3)
    assert max(s.num_running for s in out.steps) == 3 and len(out.requests) == 12
    forked = _run(_point({"kind": "static", "batch_size": 2, "prompt_len": 32, "gen_len": 4,
                          "samples_per_prompt": 3}))
    assert forked.metrics["num_requests"] == 6
    assert sorted(r["id"] for r in forked.rows)[:3] == ["r0000/0", "r0000/1", "r0000/2"]
    workload = {"kind": "static", "batch_size": 4, "prompt_len": 128, "gen_len": 33}
    plain = _run(_point(workload)).metrics
    spec = _run(_point(workload, speculative={"method": "ngram", "num_tokens": 4,
                                              "acceptance": 1.0})).metrics
    # every draft accepted: 5 tokens per step, so about a fifth of the decode steps
    assert spec["num_steps"] <= 1 + (32 + 4) // 5 < plain["num_steps"]
    assert spec["tpot_s"]["p50"] < plain["tpot_s"]["p50"]


def test_measure_duration_stops_the_submissions() -> None:
    workload = {"kind": "poisson", "rate": 10.0, "num_requests": 100, "prompt_len": 64,
                "gen_len": 8}
    whole = _run(_point(workload)).metrics
    cut = _run(_point(workload, measure={"duration_s": 2.0})).metrics
    assert whole["num_requests"] == 100 and 10 < cut["num_requests"] < 40  # ~2 s x 10 req/s
