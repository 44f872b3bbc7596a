"""Goodput and SLO attainment on synthetic request rows (vLLM's definition), and the
highest rate of a rate sweep meeting the SLOs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from infbench.measure.goodput import goodput_metrics, meets_slo, request_latencies_ms
from infbench.results.goodput import max_rate_line, max_rate_summaries
from infbench.scenario.measure import SloSection


def row(arrival: float, first: float | None, finish: float | None, n: int) -> dict[str, Any]:
    return {"id": "r", "arrival_s": arrival, "first_token_s": first, "finish_s": finish,
            "itl_s": [], "num_prompt_tokens": 8, "num_output_tokens": n,
            "num_cached_prompt_tokens": 0, "num_preemptions": 0, "finish_reason": "length"}


def test_per_request_latencies_follow_the_definitions() -> None:
    lat = request_latencies_ms(row(1.0, 1.2, 2.2, 11))
    assert lat is not None
    assert lat["ttft_ms"] == pytest.approx(200.0)
    assert lat["e2e_ms"] == pytest.approx(1200.0)
    assert lat["tpot_ms"] == pytest.approx(100.0)  # (1200 - 200) / (11 - 1)
    one = request_latencies_ms(row(0.0, 0.3, 0.3, 1))
    assert one is not None and one["tpot_ms"] == 0.0  # vLLM: a 1-token output has TPOT 0
    assert request_latencies_ms(row(0.0, None, None, 0)) is None


def test_goodput_counts_requests_meeting_every_given_objective() -> None:
    rows = [
        row(0.0, 0.10, 1.00, 10),  # ttft 100, tpot 100, e2e 1000
        row(0.0, 0.30, 0.75, 10),  # ttft 300 (misses ttft 200), tpot 50
        row(0.5, 0.60, 2.50, 11),  # ttft 100, tpot 190 (misses tpot 150), e2e 2000
        row(1.0, 1.05, 1.05, 1),   # ttft 50, tpot 0
        row(1.0, None, None, 0),   # no token: never good
    ]
    slo = SloSection(ttft_ms=200, tpot_ms=150)
    assert [meets_slo(r, slo) for r in rows] == [True, False, False, True, False]
    out = goodput_metrics(rows, slo, wall_s=4.0)
    assert out == {"goodput_requests_per_s": 0.5, "slo_attainment": 0.4, "num_slo_met": 2}
    # Only the objectives given count: e2e alone, 1500 ms.
    e2e = goodput_metrics(rows, SloSection(e2e_ms=1500), wall_s=2.0)
    assert e2e["num_slo_met"] == 3 and e2e["goodput_requests_per_s"] == 1.5
    # A value equal to the objective meets it.
    assert meets_slo(row(0.0, 0.25, 0.25, 1), SloSection(ttft_ms=250))
    with pytest.raises(ValueError):
        goodput_metrics(rows, slo, wall_s=0.0)


def result(rate: Any, attainment: float, swept: dict[str, Any] | None = None,
           target: float = 0.9) -> dict[str, Any]:
    return {"name": "sweep", "label": f"rate={rate}",
            "scenario": {"workload": {"rate": rate},
                         "measure": {"slo": {"ttft_ms": 500.0, "tpot_ms": None,
                                             "e2e_ms": None, "target": target}},
                         "swept": swept if swept is not None else {"rate": rate}},
            "metrics": {"slo_attainment": attainment, "goodput_requests_per_s": attainment * 2}}


def test_max_rate_is_the_highest_rate_meeting_the_target() -> None:
    results = [result(1.0, 1.0), result(4.0, 0.95), result(2.0, 0.91), result(8.0, 0.4)]
    (summary,) = max_rate_summaries(results)
    assert summary["rates"] == [1.0, 2.0, 4.0, 8.0]
    assert summary["max_rate"] == 4.0 and summary["goodput_at_max_rate"] == pytest.approx(1.9)
    assert "4 req/s" in max_rate_line(summary) and ">= 90%" in max_rate_line(summary)
    # A rate that passes above one that misses is not sustainable: the walk stops at 2.
    noisy = [result(1.0, 1.0), result(2.0, 0.85), result(4.0, 0.95)]
    assert max_rate_summaries(noisy)[0]["max_rate"] == 1.0
    (strict,) = max_rate_summaries([result(1.0, 0.97, target=0.99), result(2.0, 0.5, target=0.99)])
    assert strict["max_rate"] is None and "none of the rates" in max_rate_line(strict)
    (inf,) = max_rate_summaries([result(1.0, 1.0), result("inf", 0.92)])
    assert inf["max_rate"] == math.inf and "inf req/s" in max_rate_line(inf)


def test_max_rate_is_per_group_of_the_other_swept_keys() -> None:
    results = [result(r, a, {"max_concurrency": c, "rate": r})
               for c, r, a in ((1, 1.0, 0.95), (1, 2.0, 0.5), (4, 1.0, 1.0), (4, 2.0, 0.91))]
    by_group = {s["group"]: s["max_rate"] for s in max_rate_summaries(results)}
    assert by_group == {"max_concurrency=1": 1.0, "max_concurrency=4": 2.0}
