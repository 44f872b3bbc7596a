"""target.request_overhead_s: what serving adds per request, priced once in a client point's
prediction (measure/simulation.py), and no term at all for an engine point."""

from __future__ import annotations

from typing import Any

import pytest

from infbench.hardware.spec import get_hardware
from infbench.measure.prediction import price_point
from infbench.measure.simulation import request_overhead_s, simulate_point
from infbench.scenario.schema import scenario_from_document

HW = get_hardware("h100-sxm")
WORKLOAD = {"kind": "poisson", "rate": 40.0, "num_requests": 24, "prompt_len": 256,
            "gen_len": 16, "prompt_len_dist": "uniform", "gen_len_dist": "uniform",
            "len_spread": 0.5, "seed": 1}


def _point(overhead_s: float | None) -> Any:
    doc: dict[str, Any] = {"name": "o", "model": {"preset": "llama3-8b"}, "hardware": "h100-sxm",
                           "dtype": "bfloat16", "workload": WORKLOAD,
                           "engine": {"max_num_seqs": 8}}
    if overhead_s is not None:
        doc["target"] = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                         "request_overhead_s": overhead_s}
    return scenario_from_document(doc, "o.yaml").points()[0]


def test_the_term_moves_ttft_and_e2e_once_and_leaves_tpot_and_itl() -> None:
    overhead = 0.125
    base, served = _point(0.0), _point(overhead)
    cfg = base.model_config()
    a = simulate_point(base, cfg, HW)
    b = simulate_point(served, cfg, HW)
    assert a.request_overhead_s == 0 and b.request_overhead_s == overhead
    for pct in ("mean", "p50", "p90", "p99"):
        assert b.metrics["ttft_s"][pct] == pytest.approx(a.metrics["ttft_s"][pct] + overhead)
        assert b.metrics["e2e_s"][pct] == pytest.approx(a.metrics["e2e_s"][pct] + overhead)
        assert b.metrics["tpot_s"][pct] == pytest.approx(a.metrics["tpot_s"][pct])
        assert b.metrics["itl_s"][pct] == pytest.approx(a.metrics["itl_s"][pct])
    assert b.metrics["num_steps"] == a.metrics["num_steps"]  # the engine's work unchanged
    for x, y in zip(a.rows, b.rows, strict=True):  # every request, not only a percentile
        assert y["arrival_s"] == x["arrival_s"]
        assert y["first_token_s"] == pytest.approx(x["first_token_s"] + overhead)
        assert y["finish_s"] == pytest.approx(x["finish_s"] + overhead)
    assert "target.request_overhead_s (125 ms per request)" in b.note
    assert "request_overhead_s" not in a.note


def test_the_recorded_prediction_carries_the_term_once() -> None:
    """price_point (what `run`, the client and `predict` record) adds it exactly once."""
    overhead = 0.5
    served = _point(overhead)
    cfg = served.model_config()
    plain = price_point(_point(0.0), cfg, HW).to_dict()
    priced = price_point(served, cfg, HW).to_dict()
    assert priced["request_overhead_s"] == overhead and "request_overhead_s" not in plain
    assert priced["metrics"]["ttft_s"]["p50"] == pytest.approx(
        plain["metrics"]["ttft_s"]["p50"] + overhead)
    assert priced["metrics"]["tpot_s"]["p50"] == pytest.approx(plain["metrics"]["tpot_s"]["p50"])


def test_an_engine_point_has_no_term() -> None:
    point = _point(None)
    assert point.target is None and request_overhead_s(point) == 0.0
    assert "request_overhead_s" not in price_point(point, point.model_config(), HW).to_dict()
