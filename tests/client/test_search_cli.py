"""`infbench search` end to end against the mock server (latency grows with the streams in
flight), and its bad input: one line naming the file and the key, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args

from infbench.client.mock_server import MockConfig, MockServer
from infbench.results.rundir import read_manifest
from infbench.results.store import load_result


def scenario(tmp_path: Path, target: str, workload: str, search: str,
             slo: str = "{tpot_ms: 20, target: 0.9}") -> Path:
    path = tmp_path / "search.yaml"
    path.write_text(f"""
name: capacity
target: {target}
workload: {workload}
measure: {{warmup: 0, repeats: 1, slo: {slo}}}
search: {search}
""")
    return path


def test_concurrency_search_against_a_loaded_mock_finds_the_knee(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    # TPOT ~ 2 ms + 4 ms per other stream: 20 ms is met up to about 5 in flight.
    config = MockConfig(token_delay_s=0.002, load_delay_s=0.004, keep_bodies=False)
    with MockServer(config) as server:
        path = scenario(
            tmp_path, f"{{kind: openai, base_url: '{server.base_url}', model: mock-model, "
                      f"tokenizer: '{tokenizer_dir}'}}",
            "{kind: offline, num_requests: 12, prompt_len: 6, gen_len: 5, seed: 2}",
            "{over: concurrency, lo: 1, max_points: 9, boundary_repeats: 2}")
        out = tmp_path / "out"
        code, stdout, err = run_args(["search", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    summary = json.loads((out / "search.json").read_text())
    assert summary["kind"] == "infbench.search" and summary["key"] == "workload.max_concurrency"
    assert summary["status"] in ("converged", "max_points")
    value, fail = summary["bracket"]
    assert 2 <= value <= 7 and fail == value + 1  # a concurrency narrows to a width of 1
    tries = summary["tries"]
    assert [t["value"] for t in tries[:3]] == [1, 2, 4]  # doubled from lo
    assert len(tries) == summary["num_points"] <= 9
    # every try is a result file of the run, listed done in the manifest, in order
    manifest = read_manifest(out)
    assert manifest is not None and manifest.status == "done"
    assert [p.file for p in manifest.points] == [t["file"] for t in tries]
    assert {p.status for p in manifest.points} == {"done"}
    for t in tries:
        result = load_result(out / t["file"])
        assert result["scenario"]["workload"]["max_concurrency"] == t["value"]
        assert result["search"]["try"] == t["index"]
        assert result["metrics"]["slo_attainment"] == pytest.approx(t["attainment"])
    repeats = [t for t in tries if t["phase"] == "repeat"]
    assert all(t["seed"] != 2 for t in repeats)  # a repeat draws fresh arrivals
    assert "search over workload.max_concurrency" in stdout
    assert f"{value} in flight (threshold in [{value}, {fail})" in stdout
    code, report, err = run_args(["report", str(out), "--json"], capsys)  # a run dir as any
    assert code == 0, err
    doc = json.loads(report)
    rows = doc["rows"] if isinstance(doc, dict) else doc
    assert len(rows) == len(tries)


@pytest.mark.parametrize(("workload", "search", "slo", "message"), [
    ("{kind: poisson, num_requests: 4}", "{over: rate, lo: 4, hi: 2}", None,
     "search.hi: must be > search.lo (4) (got 2)"),
    ("{kind: offline, num_requests: 4}", "{over: concurrency, lo: 1.5}", None,
     "search.lo: a concurrency is a whole number of requests in flight (got 1.5)"),
    ("{kind: offline, num_requests: 4}", "{over: rate, lo: 1}", None,
     "search.over: rate needs workload.kind poisson (got offline); allowed with other "
     "kinds: concurrency"),
    ("{kind: static, batch_size: 2}", "{over: concurrency, lo: 1}", None,
     "search.over: concurrency sets workload.max_concurrency, which kind static does not"),
    ("{kind: poisson, num_requests: 4, rate: [1, 2]}", "{lo: 1}", None,
     "search.over: rate is what the search sets; remove it from workload.rate"),
    ("{kind: poisson, num_requests: 4}", "{lo: 1, steps: 3}", None,
     "search.steps: unknown key; allowed: boundary_repeats, hi, lo, max_points, over, "
     "tolerance"),
    ("{kind: poisson, num_requests: 4}", "{lo: 1, max_points: 1}", None,
     "search.max_points: must be >= 2 (got 1)"),
    ("{kind: poisson, num_requests: 4}", "{lo: 1}", "null",
     "search: needs measure.slo"),
    ("{kind: poisson, num_requests: 4}", "null", None,
     "search: required key is missing; `infbench search` needs a search: block"),
])
def test_bad_search_block_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: str, search: str,
        slo: str | None, message: str) -> None:
    path = scenario(tmp_path, "{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}",
                    workload, search, slo or "{tpot_ms: 20}")
    code, stdout, err = run_args(["search", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), err
    assert not (tmp_path / "out").exists()
