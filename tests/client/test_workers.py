"""`target.workers`: the client in N processes fed one schedule (client/workers.py)."""

from __future__ import annotations

import multiprocessing
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_args

from infbench.client.mock_server import MockConfig, MockServer
from infbench.client.openai_target import Failure, TargetRun
from infbench.client.workers import (
    WorkerPool,
    merge_runs,
    send_error_summary,
    worker_caps,
    worker_cores,
    worker_shares,
)
from infbench.engine.records import RequestRecord
from infbench.engine.request import Request, SamplingParams
from infbench.results.store import load_result
from infbench.scenario.target import TargetSection


def _requests(arrivals: list[float]) -> list[Request]:
    return [Request(f"r{i}", (20, 21, 22), SamplingParams(max_tokens=3, seed=i,
                                                          ignore_eos=True), arrival_s=a)
            for i, a in enumerate(arrivals)]


def test_shares_are_round_robin_in_arrival_order_and_the_cap_is_split_evenly() -> None:
    reqs = _requests([0.5, 0.1, 0.3, 0.0, 0.2])
    shares = worker_shares(reqs, 2)
    assert [[r.request_id for r in s] for s in shares] == [["r3", "r4", "r0"], ["r1", "r2"]]
    assert sorted(r.request_id for s in worker_shares(reqs, 3) for r in s) == \
        sorted(r.request_id for r in reqs)  # every request exactly once
    assert worker_caps(10, 4) == [3, 3, 2, 2]  # 10 streams in all
    assert worker_caps(None, 3) == [None, None, None]
    with pytest.raises(ValueError, match="3 workers cannot share a cap of 2"):
        worker_caps(2, 3)
    cores = worker_cores(5)
    assert len(cores) == 5 and cores[0] == cores[len(set(cores))]  # modulo the cores


def test_merge_orders_by_id_and_keeps_the_last_end() -> None:
    def rec(rid: str) -> RequestRecord:
        return RequestRecord(request_id=rid, arrival_s=0.0, num_prompt_tokens=1,
                             token_times_s=[0.1], finish_reason="length")

    a = TargetRun([rec("r2")], [Failure("r1", "x")], 1.5, 10.0, 1,
                  send_errors_s={"r2": 1e-4, "r1": 2e-4})
    b = TargetRun([rec("r0")], [], 2.5, 10.0, 2, send_errors_s={"r0": 3e-4})
    merged = merge_runs([a, b], 10.0)
    assert merged.num_unsent == 3
    assert [r.request_id for r in merged.records] == ["r0", "r2"]
    assert merged.wall_s == 2.5 and merged.start_perf_s == 10.0
    assert list(merged.send_errors_s) == ["r0", "r1", "r2"]
    summary = send_error_summary(list(merged.send_errors_s.values()))
    assert summary["n"] == 3 and summary["p50"] == 2e-4 and summary["max"] == 3e-4
    assert send_error_summary([]) == {}


def _child_clock(conn: multiprocessing.connection.Connection) -> None:
    conn.send(time.perf_counter())


def test_perf_counter_is_one_clock_for_every_process_of_the_host() -> None:
    """What the common t0 relies on: a spawned child's perf_counter lies between two of the
    parent's readings (CLOCK_MONOTONIC is system-wide on Linux)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child_clock, args=(child,))
    before = time.perf_counter()
    proc.start()
    theirs = parent.recv()
    after = time.perf_counter()
    proc.join(10)
    assert before < theirs < after


def test_pool_runs_every_request_once_on_the_common_clock() -> None:
    config = MockConfig(token_delay_s=0.002, log_sends=True)
    arrivals = [0.01 * i for i in range(12)]
    with MockServer(config) as server:
        target = TargetSection(kind="openai", base_url=server.base_url, model="mock-model",
                               workers=3)
        with WorkerPool(target, _requests(arrivals), 6) as pool:
            assert pool.caps == [2, 2, 2]
            run = pool.run()
        sends = {(seed, i): t for seed, i, t in config.sends}
    assert not run.failures
    assert [r.request_id for r in run.records] == sorted(f"r{i}" for i in range(12))
    assert len(config.received) == 12 and all(r.num_output_tokens == 3 for r in run.records)
    # Each token's timestamp, on the parent's clock, is after the mock wrote it and close by.
    lags = [run.start_perf_s + t - sends[(int(r.request_id[1:]), k)]
            for r in run.records for k, t in enumerate(r.token_times_s)]
    assert min(lags) > 0 and max(lags) < 0.25
    assert set(run.send_errors_s) == {r.request_id for r in run.records}
    assert all(-1e-3 < e < 0.25 for e in run.send_errors_s.values())


def scenario(tmp_path: Path, target: str, workload: str) -> Path:
    path = tmp_path / "workers.yaml"
    path.write_text(f"""
name: workers_e2e
target: {target}
workload: {workload}
measure: {{warmup: 1, repeats: 1}}
""")
    return path


def test_run_with_workers_writes_one_result_with_send_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig(token_delay_s=0.002)
    with MockServer(config) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', model: "
                                  f"mock-model, tokenizer: '{tokenizer_dir}', workers: 2}}",
                        "{kind: poisson, rate: 200, num_requests: 8, prompt_len: 8, "
                        "gen_len: 4, seed: 3, max_concurrency: 4}")
        out = tmp_path / "out"
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    result = load_result(out / "workers_e2e_000.json")
    assert len(config.received) == 16  # warm-up + repeat, each request once
    assert result["metrics"]["num_requests"] == 8
    client = result["telemetry"]["client"]
    workers = client["workers"]
    assert workers["count"] == 2 and workers["requests"] == [4, 4]
    assert workers["max_concurrency"] == [2, 2] and workers["assignment"] == "round_robin"
    assert client["send_error_s"]["n"] == 8 and client["send_error_s"]["p99"] < 0.25
    rows = result["requests"]
    assert sorted(r["worker"] for r in rows) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(r["send_error_s"] is not None for r in rows)
    assert result["scenario"]["target"]["workers"] == 2


def test_more_workers_than_the_cap_is_one_line_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, "{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m, "
                              "workers: 3}",
                    "{kind: poisson, rate: 10, num_requests: 4, max_concurrency: 2}")
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: point 0") and \
        "target.workers: 3 workers cannot share workload.max_concurrency's 2 stream(s)" \
        in lines[0] and "allowed: 1 .. 2" in lines[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("value", "message"), [
    ("0", "target.workers: must be >= 1"), ("'2'", "target.workers:"),
    ("1000", "target.workers: must be <= 256")])
def test_bad_workers_key_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     value: str, message: str) -> None:
    path = scenario(tmp_path, "{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m, "
                              f"workers: {value}}}", "{kind: offline, num_requests: 4}")
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), err


def test_ray_missing_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    path = scenario(tmp_path, "{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}",
                    "{kind: offline, num_requests: 4}")
    monkeypatch.setattr("infbench.measure.preflight.probe_target", lambda *a, **k: None)
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out"), "--ray",
                             "local"], capsys)
    assert code == 2
    assert err.strip() == "error: --ray: the ray package is not installed; install the " \
        "extra: pip install 'infbench[ray]'", err


def test_workers_with_sessions_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, "{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m, "
                              "workers: 2}",
                    "{kind: sessions, seed: 0, sessions: {num_sessions: 2, turns: 2, "
                    "user_len: 8, output_len: 4}}")
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "target.workers: workload kind sessions runs its " \
        "conversations in one client process" in lines[0], err
    assert not (tmp_path / "out").exists()
