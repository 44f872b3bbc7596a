"""Pipeline parallelism on the virtual clock (sim/pipeline_sim.py): pp virtual engines over
pp stages, each stage priced by the cost model for exactly the step's batch."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from infbench.hardware.spec import get_hardware
from infbench.measure.simulation import simulate_point, unsimulated
from infbench.roofline.analysis import pipeline_pass
from infbench.roofline.costs import SeqWork
from infbench.scenario.schema import scenario_from_document

HW = get_hardware("h100-sxm")


def _point(workload: dict[str, Any], parallel: dict[str, Any], **top: Any) -> Any:
    doc = {"name": "pp", "model": {"preset": "llama3-70b"}, "hardware": "h100-sxm",
           "dtype": "bfloat16", "workload": workload, "parallel": parallel, **top}
    return scenario_from_document(doc, "pp.yaml").points()[0]


def test_one_request_passes_every_stage_and_hops_back() -> None:
    point = _point({"kind": "static", "batch_size": 1, "prompt_len": 256, "gen_len": 4},
                   {"tp": 4, "pp": 2})
    assert unsimulated(point) == ""
    sim = simulate_point(point, point.model_config(), HW)
    times, hop = pipeline_pass(point.model_config(), HW, "bfloat16", point.quant_config(),
                               point.parallel, [(SeqWork(256, 256, 1), 1)], "prefill", "auto")
    assert len(times) == 2 and hop > 0
    # stage 0, a hop, stage 1, the sampled token back to the scheduler: pp hops in all
    assert sim.metrics["ttft_s"]["p50"] == pytest.approx(sum(times) + 2 * hop, rel=1e-9)
    assert sim.metrics["num_output_tokens"] == 4


def test_virtual_engines_keep_both_stages_busy() -> None:
    point = _point({"kind": "offline", "num_requests": 64, "prompt_len": 256, "gen_len": 64},
                   {"tp": 4, "pp": 2}, engine={"max_num_seqs": 16})
    sim = simulate_point(point, point.model_config(), HW)
    m = sim.metrics
    assert m["num_requests"] == 64 and m["num_output_tokens"] == 64 * 64
    again = simulate_point(point, point.model_config(), HW)
    assert again.metrics == m and again.rows == sim.rows  # deterministic
    # two batches in flight: the steps' spans add to about twice the run's wall time
    from infbench.measure.simulation import point_requests, sim_config
    from infbench.sim.pipeline_sim import simulate_pipeline
    from infbench.sim.step_cost import make_pricer

    cfg = point.model_config()
    requests, _ = point_requests(point, cfg)
    pricer = make_pricer(cfg, HW, "bfloat16", point.quant_config(), point.parallel)
    out = simulate_pipeline(requests, pricer,
                            sim_config(point, cfg, HW, point.quant_config(), requests, None),
                            realtime_arrivals=False)
    busy = sum(s.duration_s for s in out.steps)
    assert 1.6 < busy / out.wall_s <= 2.0 + 1e-9
    # at most max_num_seqs per virtual engine: 2 x 16 sequences at once
    assert max(s.num_running for s in out.steps) <= 16
    assert Counter(r.request_id for r in out.requests) == Counter(r.request_id
                                                                  for r in requests)


def test_a_client_cap_holds_and_a_rate_queues() -> None:
    def at(rate: float, cap: int | None = None) -> dict[str, Any]:
        w = {"kind": "poisson", "rate": rate, "num_requests": 24, "prompt_len": 256,
             "gen_len": 8, "seed": 0, **({"max_concurrency": cap} if cap else {})}
        point = _point(w, {"tp": 4, "pp": 2})
        return simulate_point(point, point.model_config(), HW).metrics

    low, high, capped = at(1.0), at(500.0), at(500.0, cap=4)
    assert high["ttft_s"]["p90"] > 5 * low["ttft_s"]["p90"]
    assert capped["num_requests"] == 24
    assert capped["output_tokens_per_s"] < high["output_tokens_per_s"]


def test_what_pp_does_not_simulate_says_so() -> None:
    sessions = _point({"kind": "sessions", "sessions": {"num_sessions": 2, "turns": 2}},
                      {"tp": 4, "pp": 2})
    assert "sessions" in unsimulated(sessions) and "pp > 1" in unsimulated(sessions)
