"""Arrival processes: gamma gaps with the requested mean and CV, rate inf, trace replay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infbench.core.errors import ConfigError
from infbench.measure.workload import arrival_times, generate_requests
from infbench.scenario.workload import DatasetSection, WorkloadPoint


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_requested_mean_and_cv(burstiness: float) -> None:
    rate, n = 5.0, 40_000
    times = arrival_times(np.random.default_rng(7), "poisson", rate, n, burstiness)
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    # Standard errors at n = 40k are under 1% for the mean and about 1-2% for the CV.
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_burstiness_one_keeps_the_poisson_arrivals_of_before() -> None:
    a = arrival_times(np.random.default_rng(3), "poisson", 2.0, 50)
    rng = np.random.default_rng(3)
    gaps = rng.exponential(0.5, size=50)
    assert np.array_equal(a, np.concatenate([[0.0], np.cumsum(gaps[:-1])]))


def test_rate_inf_and_offline_arrive_at_zero_and_bad_burstiness_is_refused() -> None:
    assert not arrival_times(np.random.default_rng(0), "poisson", float("inf"), 9).any()
    assert not arrival_times(np.random.default_rng(0), "offline", None, 9).any()
    with pytest.raises(ConfigError, match="burstiness"):
        arrival_times(np.random.default_rng(0), "poisson", 1.0, 9, burstiness=0.0)


def test_trace_replay_follows_the_timestamps(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    stamps = [10.0, 10.5, 10.75, 12.0, 15.0, 15.0, 16.25]
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{t},{5 + i},{1 + i}" for i, t in enumerate(stamps)]
    trace.write_text("\n".join(lines) + "\n")
    point = WorkloadPoint(kind="trace", num_requests=7,
                          dataset=DatasetSection(kind="trace", path=str(trace), time_scale=0.5))
    reqs = generate_requests(point, vocab_size=100)
    assert [r.arrival_s for r in reqs] == pytest.approx([(t - 10.0) * 0.5 for t in stamps])
    assert [len(r.prompt_ids) for r in reqs] == [5 + i for i in range(7)]
    assert [r.sampling.max_tokens for r in reqs] == [1 + i for i in range(7)]
    # A window of 3 consecutive rows, seeded: timestamps relative to its first row.
    window = generate_requests(dataclasses.replace(point, num_requests=3, seed=4), 100)
    first = [len(r.prompt_ids) - 5 for r in window]
    assert first == list(range(first[0], first[0] + 3))
    expect = [(stamps[i] - stamps[first[0]]) * 0.5 for i in first]
    assert [r.arrival_s for r in window] == pytest.approx(expect)
    assert window == generate_requests(dataclasses.replace(point, num_requests=3, seed=4), 100)


def test_packaged_azure_trace_replays_with_poisson_or_offline_arrivals() -> None:
    cfg = DatasetSection(kind="trace", path="infbench:samples/azure_trace_small.csv")
    replay = generate_requests(WorkloadPoint(kind="trace", num_requests=20, dataset=cfg), 500)
    arrivals = [r.arrival_s for r in replay]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[-1] > 0
    rated = generate_requests(WorkloadPoint(kind="poisson", rate=100.0, num_requests=20,
                                            dataset=cfg), 500)
    assert [len(r.prompt_ids) for r in rated] == [len(r.prompt_ids) for r in replay]
    assert [r.arrival_s for r in rated] != arrivals
