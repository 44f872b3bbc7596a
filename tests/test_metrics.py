"""Metric definitions on hand-built records with known answers."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infbench.engine.records import RequestRecord, StepRecord
from infbench.measure.metrics import (
    GATE_METRICS,
    aggregate_repeats,
    inter_token_latencies,
    latency_stats,
    summarize,
)


def step(i: int, *, start: float, dur: float, prefill: int = 0, decode: int = 0,
         blocks: int = 0, slots: int = 0, running: int = 1, preempted: int = 0) -> StepRecord:
    return StepRecord(index=i, start_s=start, duration_s=dur, num_prefill_tokens=prefill,
                      num_decode_tokens=decode, num_prefill_seqs=int(prefill > 0),
                      num_decode_seqs=int(decode > 0), num_running=running, num_waiting=0,
                      kv_blocks_used=blocks, kv_blocks_total=100, kv_slots_used=slots,
                      num_preempted=preempted)


# Two requests with hand-computable answers:
#   a: arrives 0.0, tokens at 1.0, 1.5, 2.0, 3.0 -> TTFT 1.0, E2E 3.0, TPOT 2/3,
#      ITL 0.5, 0.5, 1.0
#   b: arrives 1.0, tokens at 2.0, 4.0 (two at once), 4.0 -> TTFT 1.0, E2E 3.0,
#      TPOT (3 - 1) / 2 = 1.0, ITL: the 2.0 s gap shared by two tokens -> 1.0, 1.0
A = RequestRecord("r0000", 0.0, 10, [1.0, 1.5, 2.0, 3.0], num_cached_prompt_tokens=0)
B = RequestRecord("r0001", 1.0, 30, [2.0, 4.0, 4.0], num_cached_prompt_tokens=20)
STEPS = [
    step(0, start=0.0, dur=1.0, prefill=10, blocks=1, slots=10),
    step(1, start=1.0, dur=1.0, prefill=30, decode=1, blocks=3, slots=41, running=2),
    step(2, start=2.0, dur=2.0, decode=3, blocks=4, slots=44, running=2, preempted=1),
    step(3, start=3.0, dur=0.5, decode=1, blocks=2, slots=17),
]


def run() -> dict:
    return summarize([A, B], STEPS, wall_s=4.0, kv_bytes_per_token=100, block_size=16,
                     weight_bytes=1234, peak_memory_bytes=5678)


def test_latencies() -> None:
    m = run()
    assert m["ttft_s"] == {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p95": 1.0, "p99": 1.0}
    assert m["e2e_s"]["mean"] == pytest.approx(3.0)
    assert m["tpot_s"]["mean"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert m["tpot_s"]["p50"] == pytest.approx((2 / 3 + 1.0) / 2)  # two values: midpoint
    assert m["itl_s"]["mean"] == pytest.approx((0.5 + 0.5 + 1.0 + 1.0 + 1.0) / 5)
    assert m["itl_s"]["p50"] == pytest.approx(1.0)


def test_throughput_and_counts() -> None:
    m = run()
    assert m["num_requests"] == 2 and m["num_steps"] == 4
    assert m["num_prompt_tokens"] == 40 and m["num_output_tokens"] == 7
    assert m["output_tokens_per_s"] == pytest.approx(7 / 4)
    assert m["total_tokens_per_s"] == pytest.approx(47 / 4)
    assert m["requests_per_s"] == pytest.approx(0.5)
    assert m["prefill_tokens_per_s"] == pytest.approx(40 / 2.0)  # steps 0 and 1 had prefill
    assert m["num_preemptions"] == 1
    assert m["prefix_cache_hit_rate"] == pytest.approx(20 / 40)
    assert m["wall_s"] == 4.0


def test_memory() -> None:
    m = run()
    assert m["kv_bytes_per_token"] == 100 and m["weight_bytes"] == 1234
    assert m["peak_memory_bytes"] == 5678
    assert m["peak_kv_bytes"] == 4 * 16 * 100  # step 2: 4 blocks
    assert m["kv_fragmentation"] == pytest.approx((64 - 44) / 64)


def test_state_bytes_count_per_running_sequence() -> None:
    m = summarize([A, B], STEPS, 4.0, kv_bytes_per_token=100, block_size=16, weight_bytes=0,
                  peak_memory_bytes=0, state_bytes=10_000)
    # step 1: 3*16*100 + 2*10000 = 24800; step 2: 4*16*100 + 2*10000 = 26400 (the peak).
    assert m["peak_kv_bytes"] == 26_400
    m = summarize([A], [step(0, start=0, dur=1, running=3)], 1.0, kv_bytes_per_token=8,
                  block_size=16, weight_bytes=0, peak_memory_bytes=0, state_bytes=500)
    assert m["peak_kv_bytes"] == 1500 and m["kv_fragmentation"] == 0.0


def test_itl_shares_the_gap_among_tokens_arriving_together() -> None:
    assert inter_token_latencies([1.0, 2.0, 2.0, 2.0, 3.0]) == pytest.approx(
        [1 / 3, 1 / 3, 1 / 3, 1.0])
    assert inter_token_latencies([5.0]) == []
    assert inter_token_latencies([]) == []
    # Tokens that came with the first token are part of TTFT, not ITL.
    assert inter_token_latencies([1.0, 1.0, 3.0]) == pytest.approx([2.0])


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30))
def test_itl_sums_to_the_decode_time(gaps: list[float]) -> None:
    times = list(np.cumsum([0.5] + gaps))
    itl = inter_token_latencies(times)
    assert sum(itl) == pytest.approx(times[-1] - times[0], abs=1e-9)


def test_empty_and_single_token_cases() -> None:
    one = RequestRecord("r0", 0.0, 5, [0.25])
    m = summarize([one], [step(0, start=0, dur=0.25, prefill=5)], 0.5, kv_bytes_per_token=1,
                  block_size=16, weight_bytes=0, peak_memory_bytes=0)
    assert m["tpot_s"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    assert m["itl_s"]["p99"] is None and m["ttft_s"]["p50"] == 0.25
    m = summarize([], [], 1.0, kv_bytes_per_token=1, block_size=16, weight_bytes=0,
                  peak_memory_bytes=0)
    assert m["prefill_tokens_per_s"] is None and m["prefix_cache_hit_rate"] is None
    assert m["peak_kv_bytes"] == 0 and m["kv_fragmentation"] is None
    with pytest.raises(ValueError):
        summarize([one], [], 0.0, kv_bytes_per_token=1, block_size=16, weight_bytes=0,
                  peak_memory_bytes=0)


def test_percentiles_match_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    stats = latency_stats(values)
    assert stats["p50"] == pytest.approx(50.5)
    assert stats["p90"] == pytest.approx(90.1)
    assert stats["p99"] == pytest.approx(99.01)
    assert stats["mean"] == pytest.approx(50.5)


def test_aggregate_repeats_takes_medians_and_spreads() -> None:
    runs = [
        {"output_tokens_per_s": 10.0, "num_steps": 5, "ttft_s": {"mean": 1.0, "p50": 1.0},
         "tpot_s": {"p50": None}, "name": "a", "extra": {"nested": {"x": 1.0}}},
        {"output_tokens_per_s": 30.0, "num_steps": 5, "ttft_s": {"mean": 3.0, "p50": 2.0},
         "tpot_s": {"p50": None}, "name": "a", "extra": {"nested": {"x": 5.0}}},
        {"output_tokens_per_s": 20.0, "num_steps": 6, "ttft_s": {"mean": 2.0, "p50": 9.0},
         "tpot_s": {"p50": None}, "name": "a", "extra": {"nested": {"x": 3.0}}},
    ]
    median, spread = aggregate_repeats(runs)
    assert median["output_tokens_per_s"] == 20.0
    assert median["num_steps"] == 5 and isinstance(median["num_steps"], int)
    assert median["ttft_s"] == {"mean": 2.0, "p50": 2.0}
    assert median["tpot_s"] == {"p50": None}
    assert median["name"] == "a" and median["extra"]["nested"]["x"] == 3.0
    assert spread["output_tokens_per_s"] == {
        "min": 10.0, "max": 30.0, "stdev": pytest.approx(statistics.stdev([10, 30, 20]))}
    assert spread["ttft_s.p50"]["max"] == 9.0
    assert "tpot_s.p50" not in spread and "name" not in spread
    assert "ttft_s.mean" not in spread


def test_counts_over_an_even_number_of_repeats_stay_integers() -> None:
    """Two repeats of 10 and 11 decode steps: the result schema wants an integer count."""
    runs = [{"num_steps": 10, "rate": 1.0}, {"num_steps": 11, "rate": 2.0},
            {"num_steps": 13, "rate": 3.0}, {"num_steps": 12, "rate": 4.0}]
    median, _ = aggregate_repeats(runs)
    assert median["num_steps"] == 11 and isinstance(median["num_steps"], int)
    assert median["rate"] == 2.5
    median, _ = aggregate_repeats(runs[:2])
    assert median["num_steps"] == 10 and isinstance(median["num_steps"], int)


def test_aggregate_single_run_and_real_summaries() -> None:
    median, spread = aggregate_repeats([run()])
    assert median == run()
    assert spread["output_tokens_per_s"]["stdev"] == 0.0
    with pytest.raises(ValueError):
        aggregate_repeats([])


def test_gate_metric_names_exist_in_a_summary() -> None:
    m = run()
    for name in GATE_METRICS:
        head, _, stat = name.partition(".")
        assert head in m and (not stat or stat in m[head])
