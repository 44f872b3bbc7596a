"""Measurement windows (measure/windows.py): the interval each bound gives, what is counted
inside it, time-based runs on the engine and the client, and the scenario's refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import random
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from engine_helpers import make_engine, random_requests

from infbench.client.mock_server import MockConfig, MockServer
from infbench.client.openai_target import ClientPlan, open_session, run_requests
from infbench.core.errors import UserError
from infbench.engine.request import Request, SamplingParams
from infbench.measure.metrics import aggregate_repeats
from infbench.measure.windows import (
    concurrency_target,
    steady_band,
    timed_workload,
    token_times,
    window_interval,
    window_metrics,
)
from infbench.measure.workload import generate_requests
from infbench.model.loader import load_model
from infbench.scenario.document import validate
from infbench.scenario.measure import WindowSection
from infbench.scenario.target import TargetSection
from infbench.scenario.workload import WorkloadPoint


def row(rid: str, arrival: float, first: float, finish: float, tokens: int,
        prompt: int = 10) -> dict[str, Any]:
    """A request row whose tokens after the first come evenly spaced up to `finish`."""
    gap = (finish - first) / (tokens - 1) if tokens > 1 else 0.0
    return {"id": rid, "arrival_s": arrival, "first_token_s": first, "finish_s": finish,
            "itl_s": [gap] * (tokens - 1), "num_prompt_tokens": prompt,
            "num_output_tokens": tokens, "num_cached_prompt_tokens": 0, "num_preemptions": 0,
            "finish_reason": "length"}


def closed_loop(num: int, cap: int, service_s: float = 1.0) -> list[dict[str, Any]]:
    """`num` requests, `cap` at a time, each taking service_s (5 tokens, first at +0.2)."""
    rows, free = [], [0.0] * cap
    for i in range(num):
        slot = min(range(cap), key=lambda k: free[k])
        start = free[slot]
        rows.append(row(f"r{i:02d}", start, start + 0.2, start + service_s, 5))
        free[slot] = start + service_s
    return rows


def test_token_times_put_the_tokens_without_an_itl_sample_with_the_first() -> None:
    r = row("a", 0.0, 1.0, 2.0, 3)
    assert token_times(r) == pytest.approx([1.0, 1.5, 2.0])
    grouped = {**r, "num_output_tokens": 4, "itl_s": [0.5, 0.5]}  # two came with the first
    assert token_times(grouped) == pytest.approx([1.0, 1.0, 1.5, 2.0])


def test_a_time_window_keeps_the_requests_inside_and_counts_the_tokens_inside() -> None:
    rows = [row("a", 0.0, 0.5, 1.0, 3), row("b", 1.0, 1.5, 3.0, 4), row("c", 2.0, 2.5, 4.0, 4)]
    m = window_metrics(rows, 4.0, WindowSection(warmup_s=1.0, cooldown_s=0.5), target=None,
                       percentiles=[50])
    assert (m["start_s"], m["end_s"], m["wall_s"]) == (1.0, 3.5, 2.5)
    assert m["num_requests"] == 1 and m["e2e_s"]["p50"] == pytest.approx(2.0)  # b only
    # inside [1, 3.5]: a's last token (1.0), all 4 of b, c's first three (2.5, 3.0, 3.5)
    assert m["output_tokens_per_s"] == pytest.approx(8 / 2.5)
    assert m["requests_per_s"] == pytest.approx(2 / 2.5)  # a and b finished inside
    assert m["total_tokens_per_s"] == pytest.approx((8 + 20) / 2.5)  # b's and c's prompts


def test_request_counts_leave_out_by_arrival_order_even_at_one_instant() -> None:
    rows = [row(f"r{i}", 0.0, 0.1 * (i + 1), 1.0 + i, 2) for i in range(4)]
    m = window_metrics(rows, 4.0, WindowSection(warmup_requests=1, cooldown_requests=1),
                       target=None, percentiles=[50])
    assert m["num_requests"] == 2  # r1 and r2: r0 first by id, r3 last
    assert (m["start_s"], m["end_s"]) == (0.0, 3.0)  # the last kept request's finish
    assert m["ttft_s"]["p50"] == pytest.approx(0.25)


def test_steady_state_runs_from_reaching_the_cap_to_the_drain() -> None:
    rows = closed_loop(10, cap=2)  # pairs start at 0, 1, 2, 3, 4; the drain starts at 5
    m = window_metrics(rows, 5.0, WindowSection(steady_state=True), target=2,
                       percentiles=[50])
    assert (m["start_s"], m["end_s"]) == (0.0, 5.0)
    staggered = [row("a", 0.0, 0.2, 1.0, 5), *[{**r, "id": f"x{r['id']}"}
                                               for r in closed_loop(6, cap=2)]]
    for r in staggered[1:]:  # the loop starts at 0.5, after a alone
        r.update(arrival_s=r["arrival_s"] + 0.5, first_token_s=r["first_token_s"] + 0.5,
                 finish_s=r["finish_s"] + 0.5)
    start, end, _ = window_interval(staggered, 3.5, WindowSection(steady_state=True), 3)
    assert (start, end) == (0.5, 1.0)  # 3 outstanding only until a finished (hand-overs
    # at one instant keep 2 outstanding, never 3 or 4)
    with pytest.raises(UserError, match="holds no request"):  # none ran inside [0.5, 1]
        window_metrics(staggered, 3.5, WindowSection(steady_state=True), target=3,
                       percentiles=[50])
    with pytest.raises(UserError, match="never reached their target 4"):
        window_metrics(closed_loop(6, cap=2), 3.0, WindowSection(steady_state=True),
                       target=4 * 10, percentiles=[50])


def open_loop(num: int, gap_s: float, service_s: Any) -> list[dict[str, Any]]:
    """`num` requests arriving every gap_s, request i taking service_s(i) seconds."""
    return [row(f"r{i:03d}", i * gap_s, i * gap_s + 0.0625, i * gap_s + service_s(i), 5)
            for i in range(num)]


def test_open_loop_steady_state_is_the_band_around_the_median_outstanding() -> None:
    # one arrival every 1/8 s, each request 1 s: 8 outstanding once the ramp is over (each
    # arrival meets a finish at the same instant), then the drain after the last arrival
    rows = open_loop(80, 0.125, lambda _: 1.0)
    slack = 2 * math.sqrt(8)  # two Poisson deviations: wider than 25% of 8
    assert steady_band(rows) == (8.0, 8 - slack, 8 + slack)
    start, end, _ = window_interval(rows, 10.875, WindowSection(steady_state=True), None)
    assert start == 0.25  # the 3rd arrival: 3 outstanding, above the band's low edge 2.34
    assert end == 9.875  # the last arrival: from then on the load only drains
    m = window_metrics(rows, 10.875, WindowSection(steady_state=True), target=None,
                       percentiles=[50])
    assert m["num_requests"] == 70  # r002 .. r071: arrived from 0.25, finished by 9.875
    # a large steady load: the band is 25% of the median (more than two deviations)
    wide = open_loop(800, 0.0078125, lambda _: 1.0)  # 1/128 s apart: 128 outstanding
    assert steady_band(wide) == (128.0, 96.0, 160.0)
    # a noisy open loop (exponential gaps, mean 0.1 s; 1 s each): its median is about
    # rate x service = 10, and the window leaves the ramp and the drain out
    rng = random.Random(7)
    times = list(itertools.accumulate(rng.expovariate(10.0) for _ in range(400)))
    noisy = [row(f"n{i:03d}", t, t + 0.0625, t + 1.0, 5) for i, t in enumerate(times)]
    median, low, high = steady_band(noisy)
    assert 8 <= median <= 12
    assert high - median == pytest.approx(median - low) == pytest.approx(2 * math.sqrt(median))
    start, end, _ = window_interval(noisy, times[-1] + 1, WindowSection(steady_state=True),
                                    None)
    assert times[0] < start < 1.0 and times[-1] - 1.0 < end <= times[-1]


def test_an_open_loop_that_never_settles_has_no_steady_state() -> None:
    # the server serves at half the arrival rate: the outstanding requests grow all along
    behind = open_loop(80, 0.125, lambda i: 1.0 + 0.125 * i)
    with pytest.raises(UserError, match=r"^measure.window.steady_state: the outstanding "
                                        r"requests never settled: .* over the first half"):
        window_metrics(behind, 21.0, WindowSection(steady_state=True), target=None,
                       percentiles=[50])
    at_once = [row(f"r{i}", 0.0, 0.1, 1.0 + i, 3) for i in range(4)]
    with pytest.raises(UserError, match="every request arrived at one instant"):
        window_interval(at_once, 4.0, WindowSection(steady_state=True), None)


def test_an_empty_window_is_one_line_naming_the_key() -> None:
    with pytest.raises(UserError, match=r"^measure.window: the window \[3, 3.5\] s"):
        window_metrics(closed_loop(4, cap=2), 4.0, WindowSection(warmup_s=3.0,
                                                                 cooldown_s=0.5),
                       target=None, percentiles=[50])


def test_the_window_has_its_own_spread_over_repeats() -> None:
    runs = [{"output_tokens_per_s": v, "window": {"output_tokens_per_s": v * 2,
                                                  "ttft_s": {"p50": v}}} for v in (1.0, 3.0)]
    median, spread = aggregate_repeats(runs)
    assert median["window"]["output_tokens_per_s"] == 4.0
    assert spread["window.output_tokens_per_s"] == {"min": 2.0, "max": 6.0,
                                                    "stdev": pytest.approx(2.828, rel=1e-3)}
    assert "window.ttft_s.p50" in spread


def test_a_timed_poisson_run_draws_the_arrivals_before_the_duration() -> None:
    point = validate({"name": "t", "model": {"preset": "tiny"},
                      "workload": {"kind": "poisson", "rate": 40.0, "seed": 5},
                      "measure": {"duration_s": 1.5}}, "t.yaml").points()[0]
    workload = timed_workload(point)
    arrivals = [r.arrival_s for r in generate_requests(workload, 100)]
    assert max(arrivals) < 1.5 and 30 < len(arrivals) < 95
    longer = generate_requests(dataclasses.replace(workload, num_requests=len(arrivals) + 1), 100)
    assert [r.arrival_s for r in longer[:-1]] == arrivals  # the same seeded stream
    assert longer[-1].arrival_s >= 1.5  # the next one is past the duration
    capped = dataclasses.replace(point, workload=dataclasses.replace(point.workload,
                                                                     num_requests=10))
    assert timed_workload(capped).num_requests == 10  # num_requests caps it
    assert concurrency_target(WorkloadPoint(batch_size=3, samples_per_prompt=2)) == 6
    assert concurrency_target(WorkloadPoint(kind="offline")) is None


@pytest.fixture(scope="module")
def loaded():  # type: ignore[no-untyped-def]
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=1,
                      overrides={"max_seq_len": 64})


def test_the_engine_stops_submitting_at_the_duration_and_finishes_the_rest(
        loaded) -> None:  # type: ignore[no-untyped-def]
    base = random_requests([6] * 24, gen=4, vocab=loaded.config.vocab_size)
    requests = [dataclasses.replace(r, arrival_s=0.05 * i) for i, r in enumerate(base)]
    engine = make_engine(loaded, requests, max_num_seqs=8)
    out = engine.run(requests, realtime_arrivals=True, max_concurrency=2,
                     submit_until_s=0.12)
    sent = sorted(r.request_id for r in out.requests)
    assert sent and set(sent) <= {"r0", "r1", "r2"}  # due before 0.12 s; none after it
    assert all(r.arrival_s < 0.12 for r in out.requests)
    assert all(r.num_output_tokens == 4 for r in out.requests)  # in flight: finished


def test_the_client_sends_nothing_after_the_duration() -> None:
    reqs = [Request(f"r{i:02d}", (12, 13, 14), SamplingParams(max_tokens=3), arrival_s=0.05 * i)
            for i in range(10)]
    with MockServer(MockConfig(token_delay_s=0.01)) as server:
        section = TargetSection(kind="openai", base_url=server.base_url, model="mock-model")

        async def main():  # type: ignore[no-untyped-def]
            async with open_session(section, 8) as session:
                return await run_requests(ClientPlan(section), reqs, session=session,
                                          submit_until_s=0.22)

        out = asyncio.run(main())
    assert sorted(r.request_id for r in out.records) == [f"r{i:02d}" for i in range(5)]
    assert out.num_unsent == 5 and not out.failures
    assert all(r.num_output_tokens == 3 for r in out.records)


@pytest.mark.parametrize("measure, workload, message", [
    ({"duration_s": 2}, {"kind": "offline"}, "measure.duration_s: kind offline without "
     "max_concurrency submits every request at t=0"),
    ({"duration_s": 2}, {"kind": "static", "batch_size": 2}, "measure.duration_s: kind static "
     "sends requests as slots free up, so workload.num_requests must say"),
    ({"window": {}}, {}, "measure.window: give at least one of"),
    ({"window": {"steady_state": True}}, {"kind": "offline"},
     "measure.window.steady_state: kind offline without max_concurrency has neither a "
     "concurrency target nor arrivals over time"),
    ({"window": {"warmup_requests": 3, "cooldown_requests": 1}}, {"batch_size": 4},
     "measure.window: warmup_requests + cooldown_requests (4) leave none of the 4"),
    ({"duration_s": 1, "window": {"warmup_s": 0.5, "cooldown_s": 0.5}},
     {"kind": "poisson", "rate": 2}, "measure.window: warmup_s + cooldown_s (1 s) leave"),
    ({"window": {"warmup_s": -1}}, {}, "measure.window.warmup_s:"),
    ({"duration_s": 2}, {"kind": "sessions"}, "measure.duration_s: kind sessions plays"),
])
def test_the_scenario_refuses_windows_that_cannot_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        measure: dict[str, Any], workload: dict[str, Any], message: str) -> None:
    import json

    path = tmp_path / "w.yaml"
    path.write_text(json.dumps({"name": "w", "device": "cpu", "model": {"preset": "tiny"},
                                "workload": workload, "measure": measure}))
    code, out, err = run_cli(monkeypatch, capsys, "run", str(path), "--out",
                             str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}: {message}")
    assert not (tmp_path / "out").exists()


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         doc: dict[str, Any]) -> tuple[dict[str, Any], str]:
    import json

    from infbench.results.store import load_result

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(tmp_path / "o"))
    assert code == 0, err
    return load_result(tmp_path / "o" / f"{doc['name']}_000.json"), err


def test_a_timed_windowed_client_run_keeps_both_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig(first_delay_s=0.01, token_delay_s=0.005)) as server:
        result, err = _run(tmp_path, monkeypatch, capsys, {
            "name": "timed", "model": {"preset": "tiny"},
            "target": {"kind": "openai", "base_url": server.base_url, "model": "mock-model"},
            "workload": {"kind": "offline", "max_concurrency": 2, "num_requests": 300,
                         "prompt_len": 4, "gen_len": 4},
            "measure": {"warmup": 0, "repeats": 2, "duration_s": 0.4,
                        "window": {"warmup_s": 0.05, "steady_state": True}}})
    m, w = result["metrics"], result["metrics"]["window"]
    assert 4 <= m["num_requests"] < 300  # the duration, not the count, ended each repeat
    assert result["telemetry"]["client"]["num_sent"] < 600
    assert 0.05 <= w["start_s"] < w["end_s"] <= m["wall_s"] and w["num_requests"] < \
        m["num_requests"]
    assert all("window" in r for r in result["repeats"])
    assert "window.output_tokens_per_s" in result["spread"]
    assert "all 300 requests were sent" not in err


def test_a_poisson_client_run_has_an_open_loop_steady_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig(first_delay_s=0.01, token_delay_s=0.01)) as server:
        result, _ = _run(tmp_path, monkeypatch, capsys, {
            "name": "open", "model": {"preset": "tiny"},
            "target": {"kind": "openai", "base_url": server.base_url, "model": "mock-model"},
            "workload": {"kind": "poisson", "rate": 40, "seed": 2, "prompt_len": 4,
                         "gen_len": 8},
            "measure": {"warmup": 0, "repeats": 1, "duration_s": 1.5,
                        "window": {"steady_state": True}}})
    rows, w = result["requests"], result["metrics"]["window"]
    # the window ends by the last arrival: the drain after it is left out
    assert w["end_s"] <= max(r["arrival_s"] for r in rows) + 1e-9
    assert 0 < w["num_requests"] < result["metrics"]["num_requests"]


def test_an_engine_run_with_a_window_and_a_count_bound_duration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    result, err = _run(tmp_path, monkeypatch, capsys, {
        "name": "engine_window", "device": "cpu", "dtype": "float32", "hardware": "cpu",
        "model": {"preset": "tiny", "overrides": {"max_seq_len": 64}},
        "workload": {"kind": "static", "batch_size": 2, "num_requests": 6, "prompt_len": 6,
                     "gen_len": 3},
        "engine": {"block_size": 4, "max_num_batched_tokens": 32},
        "measure": {"warmup": 0, "repeats": 1, "duration_s": 600,
                    "window": {"warmup_requests": 1, "steady_state": True}}})
    assert "measure.duration_s: all 6 requests were sent before 600 s" in err
    w = result["metrics"]["window"]
    assert result["metrics"]["num_requests"] == 6 and 1 <= w["num_requests"] <= 5
    assert w["end_s"] <= result["metrics"]["wall_s"]
