"""Per-request rows: every result stores them, and they give back its latency metrics exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infbench.engine.records import RequestRecord
from infbench.measure.metrics import from_request_rows, request_rows, summarize
from infbench.results.store import to_jsonable
from infbench.scenario.schema import load_scenario

_ROW_KEYS = {"id", "arrival_s", "first_token_s", "finish_s", "itl_s", "num_prompt_tokens",
             "num_output_tokens", "num_cached_prompt_tokens", "num_preemptions",
             "finish_reason"}
_LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
_RATES = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")

# a: tokens at 1.0, 1.5, 2.0, 3.0 -> ITL 0.5, 0.5, 1.0; b: two tokens at once share a gap;
# c: one token (no TPOT, no ITL); d: no token at all (no latency of any kind).
A = RequestRecord("r0", 0.0, 10, [1.0, 1.5, 2.0, 3.0])
B = RequestRecord("r1", 1.0, 30, [2.0, 4.0, 4.0], num_cached_prompt_tokens=20,
                  num_preemptions=1, finish_reason="eos")
C = RequestRecord("r2", 0.5, 7, [0.75])
D = RequestRecord("r3", 0.25, 3, [])


def test_rows_carry_the_documented_fields_on_the_run_clock() -> None:
    rows = request_rows([A, B, C, D])
    assert all(set(r) == _ROW_KEYS for r in rows)
    assert rows[0] == {"id": "r0", "arrival_s": 0.0, "first_token_s": 1.0, "finish_s": 3.0,
                       "itl_s": [0.5, 0.5, 1.0], "num_prompt_tokens": 10,
                       "num_output_tokens": 4, "num_cached_prompt_tokens": 0,
                       "num_preemptions": 0, "finish_reason": "length"}
    assert rows[1]["itl_s"] == [1.0, 1.0] and rows[1]["finish_reason"] == "eos"
    assert rows[1]["num_cached_prompt_tokens"] == 20 and rows[1]["num_preemptions"] == 1
    assert rows[2]["itl_s"] == [] and rows[2]["first_token_s"] == rows[2]["finish_s"] == 0.75
    assert rows[3]["first_token_s"] is None and rows[3]["finish_s"] is None


def test_rows_recompute_summarize_exactly_and_with_other_percentiles() -> None:
    m = summarize([A, B, C, D], [], wall_s=4.0, kv_bytes_per_token=1, block_size=16,
                  weight_bytes=0, peak_memory_bytes=0)
    rows = json.loads(json.dumps(request_rows([A, B, C, D])))
    again = from_request_rows(rows, wall_s=4.0)
    assert again == {k: m[k] for k in _LATENCIES + _RATES}
    assert m["ttft_s"]["mean"] == pytest.approx((1.0 + 1.0 + 0.25) / 3)
    assert m["tpot_s"]["p50"] == pytest.approx((2 / 3 + 1.0) / 2)  # c and d have no TPOT
    assert m["requests_per_s"] == 1.0 and m["output_tokens_per_s"] == 8 / 4.0
    custom = from_request_rows(rows, percentiles=[25, 99.9])
    assert set(custom["itl_s"]) == {"mean", "p25", "p99.9"}
    assert custom["itl_s"]["p25"] == pytest.approx(0.5)  # numpy linear: [.5 .5 1 1 1]
    assert custom["itl_s"]["p99.9"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        from_request_rows(rows, wall_s=0.0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny point through the real engine, 2 repeats, custom percentiles, as JSON."""
    from infbench.measure.bench import run_point

    tmp = tmp_path_factory.mktemp("rows")
    doc = {"name": "rows", "device": "cpu", "dtype": "float32", "hardware": "cpu",
           "model": {"preset": "tiny", "overrides": {"max_seq_len": 64, "num_layers": 2}},
           "workload": {"kind": "static", "batch_size": 3, "prompt_len": 8, "gen_len": 5,
                        "gen_len_dist": "uniform", "seed": 1},
           "engine": {"block_size": 4, "max_num_seqs": 2},
           "measure": {"warmup": 0, "repeats": 2, "percentiles": [50, 75, 99.9]}}
    path = Path(tmp) / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run_point(load_scenario(path).points()[0])
    return json.loads(json.dumps(to_jsonable(result)))  # what a result file holds


def test_every_result_stores_the_last_repeats_rows(measured: dict[str, Any]) -> None:
    rows = measured["requests"]
    last = measured["repeats"][-1]
    assert len(rows) == last["num_requests"] == 3
    assert all(set(r) == _ROW_KEYS for r in rows)
    assert sum(r["num_output_tokens"] for r in rows) == last["num_output_tokens"]
    steps = measured["steps"]
    end = steps[-1]["start_s"] + steps[-1]["duration_s"]
    for r in rows:  # the steps' clock: every token lands inside the recorded steps
        assert 0.0 <= r["arrival_s"] <= r["first_token_s"] <= r["finish_s"] <= end + 1e-9
        assert len(r["itl_s"]) == r["num_output_tokens"] - 1


def test_stored_rows_recompute_the_stored_metrics_exactly(measured: dict[str, Any]) -> None:
    last = measured["repeats"][-1]
    again = from_request_rows(measured["requests"], [50, 75, 99.9], wall_s=last["wall_s"])
    assert again == {k: last[k] for k in _LATENCIES + _RATES}
    assert set(measured["metrics"]["ttft_s"]) == {"mean", "p50", "p75", "p99.9"}
