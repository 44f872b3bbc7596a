"""Client-side max_concurrency in an in-process run of the tiny model, and static's
num_requests (batch_size at a time)."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, random_requests

from infbench.engine.request import Request
from infbench.measure.bench import client_concurrency
from infbench.model.loader import load_model
from infbench.scenario.workload import WorkloadPoint


@pytest.fixture(scope="module")
def loaded():  # type: ignore[no-untyped-def]
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=1,
                      overrides={"max_seq_len": 64})


def outstanding_after_each_step(out) -> list[int]:  # type: ignore[no-untyped-def]
    """Requests submitted and not finished at the end of each step, from the records."""
    ends = [s.start_s + s.duration_s for s in out.steps]
    return [sum(1 for r in out.requests if r.arrival_s <= t < r.finish_s) for t in ends]


@pytest.mark.parametrize("cap", [1, 3])
def test_never_more_than_n_outstanding(loaded, cap: int) -> None:  # type: ignore[no-untyped-def]
    requests = random_requests([5, 9, 6, 7, 4, 8, 5], gen=4, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, requests, max_num_seqs=8)
    out = engine.run(requests, realtime_arrivals=False, max_concurrency=cap)
    assert len(out.requests) == 7 and all(r.num_output_tokens == 4 for r in out.requests)
    assert max(s.num_running + s.num_waiting for s in out.steps) <= cap
    assert max(outstanding_after_each_step(out)) <= cap
    # The first cap requests arrive at t=0; the held ones when a slot freed, so each
    # one's TTFT counts from its own submission, after an earlier request finished.
    arrivals = sorted(r.arrival_s for r in out.requests)
    assert arrivals[:cap] == [0.0] * cap and all(a > 0 for a in arrivals[cap:])
    finishes = sorted(r.finish_s for r in out.requests)
    for k, a in enumerate(arrivals[cap:]):
        assert a >= finishes[k]
    plain = engine.run(requests, realtime_arrivals=False)
    assert max(s.num_running + s.num_waiting for s in plain.steps) == 7
    assert all(r.arrival_s == 0.0 for r in plain.requests)


def test_samples_of_one_request_share_its_slot(loaded) -> None:  # type: ignore[no-untyped-def]
    base = random_requests([6, 6, 6], gen=3, vocab=loaded.config.vocab_size)
    requests = [Request(r.request_id, r.prompt_ids, r.sampling, n=2) for r in base]
    engine = make_engine(loaded, requests, max_num_seqs=8)
    out = engine.run(requests, realtime_arrivals=False, max_concurrency=1)
    assert len(out.requests) == 6
    assert max(s.num_running + s.num_waiting for s in out.steps) <= 2  # 1 request x 2 samples


def test_static_runs_num_requests_batch_size_at_a_time() -> None:
    assert WorkloadPoint(batch_size=4).num_prompts == 4  # unset: one batch, as before
    assert client_concurrency(WorkloadPoint(batch_size=4)) is None
    many = WorkloadPoint(batch_size=4, num_requests=10)
    assert many.num_prompts == 10 and client_concurrency(many) == 4
    assert WorkloadPoint(kind="offline").num_prompts == 64
    assert client_concurrency(WorkloadPoint(kind="offline", max_concurrency=3)) == 3
