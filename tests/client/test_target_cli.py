"""`infbench run` of scenarios with `target:`: bad config in one line, the mock end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args

from infbench.client.mock_server import MockConfig, MockServer
from infbench.results.store import load_result


def scenario(tmp_path: Path, target: str, extra: str = "") -> Path:
    path = tmp_path / "target.yaml"
    path.write_text(f"""
name: client_e2e
target: {target}
workload: {{kind: offline, num_requests: 6, prompt_len: 8, gen_len: 5, seed: 3}}
measure: {{warmup: 1, repeats: 2}}
{extra}""")
    return path


@pytest.mark.parametrize(("target", "message"), [
    ("{kind: grpc, base_url: 'http://h:1/v1', model: m}",
     "target.kind: unknown value 'grpc'; allowed: openai"),
    ("{kind: openai, model: m}", "target.base_url: required key is missing"),
    ("{kind: openai, base_url: 'ftp://h/v1', model: m}", "target.base_url: must be an http"),
    ("{kind: openai, base_url: 'http://h:1/v1', model: m, api_key_env: INFBENCH_NO_SUCH_KEY}",
     "target.api_key_env: environment variable INFBENCH_NO_SUCH_KEY is not set"),
    ("{kind: openai, base_url: 'http://h:1/v1', model: m, endpoint: chat}",
     "target.tokenizer: endpoint chat sends prompts as text"),
    ("{kind: openai, base_url: 'http://h:1/v1', model: m, verbose: true}",
     "target.verbose: unknown key"),
    ("{kind: openai, base_url: 'http://me:hunter2@h:1/v1', model: m}",
     "target.base_url: must not carry credentials (got 'http://***@h:1/v1'); put the key in "
     "an environment variable and name it in api_key_env"),
    ("{kind: openai, base_url: 'http://h:1/v1?api_key=hunter2', model: m}",
     "target.base_url: is the API root; a query or fragment is not part of it"),
    ("{kind: openai, base_url: 'http://h:1/v1', model: m, request_timeout_s: 0}",
     "target.request_timeout_s: must be > 0"),
    ("{kind: openai, base_url: 'http://h:1/v1', model: m, request_overhead_s: -0.1}",
     "target.request_overhead_s: must be >= 0"),
])
def test_bad_target_is_one_line_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        target: str, message: str) -> None:
    monkeypatch.delenv("INFBENCH_NO_SUCH_KEY", raising=False)
    path = scenario(tmp_path, target)
    code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), err
    assert "hunter2" not in err
    assert not (tmp_path / "out").exists()  # refused before a run directory is made


def test_scenario_without_model_or_target_still_needs_a_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "none.yaml"
    path.write_text("name: x\nworkload: {kind: offline}\n")
    code, _, err = run_args(["run", str(path)], capsys)
    assert code == 2 and err.strip() == f"error: {path}: model: required key is missing " \
        "(or give target: to measure a server)"


def test_run_against_the_mock_writes_a_result_report_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    config = MockConfig(token_delay_s=0.005)
    with MockServer(config) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  f"model: mock-model, tokenizer: '{tokenizer_dir}'}}")
        out = tmp_path / "out"
        code, stdout, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 0, err
    assert "output tok/s" in stdout or "output" in stdout
    result = load_result(out / "client_e2e_000.json")  # the result schema, validated
    assert len(config.received) == 6 * 3  # warm-up + 2 repeats
    m = result["metrics"]
    assert m["num_requests"] == 6 and m["num_output_tokens"] == 30
    assert m["num_prompt_tokens"] == 48
    assert m["tpot_s"]["p50"] == pytest.approx(0.005, abs=0.003)
    assert len(result["repeats"]) == 2 and result["steps"] == []
    assert result["prediction"] == {} and result["hardware"] is None  # no model, no hardware
    env = result["env"]
    assert env["backend"] == "openai-client" and env["device"] == "remote"
    assert env["endpoint"]["base_url"] == server.base_url
    assert env["endpoint"]["models"]["data"][0]["id"] == "mock-model"
    assert env["client"]["host"] and "git_sha" in env  # None outside a git checkout
    assert result["scenario"]["target"]["model"] == "mock-model"
    assert result["telemetry"]["client"]["num_failed"] == 0
    assert [r["num_output_tokens"] for r in result["requests"]] == [5] * 6

    code, report, err = run_args(["report", str(out)], capsys)
    assert code == 0, err
    assert "default" in report
    code, compare, err = run_args(["compare", str(out / "client_e2e_000.json"),
                                   str(out / "client_e2e_000.json")], capsys)
    assert code == 0, err


def test_failed_requests_are_reported_and_all_failed_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    with MockServer(MockConfig(fail_every=4)) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  f"model: mock-model, tokenizer: '{tokenizer_dir}'}}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "some")], capsys)
    assert code == 0, err
    assert "request(s) failed" in err and "HTTP 500" in err
    result = json.loads((tmp_path / "some" / "client_e2e_000.json").read_text())
    client = result["telemetry"]["client"]
    assert client["num_sent"] == 12 and client["num_failed"] == sum(
        client["failed_per_repeat"]) > 0
    assert "HTTP 500" in client["first_error"]
    assert result["metrics"]["num_requests"] + client["failed_per_repeat"][-1] == 6
    assert client["failures_by_reason"] == {"http_status": client["num_failed"]}
    last = client["failed_requests"]
    assert len(last) == client["failed_per_repeat"][-1]
    assert all(f["reason"] == "http_status" and "HTTP 500" in f["error"] for f in last)
    code, _, err = run_args(["report", str(tmp_path / "some")], capsys)
    assert code == 0
    assert f"client failures: client_e2e: {client['num_failed']} of 12 request(s) failed " \
        f"(http_status {client['num_failed']})" in err

    with MockServer(MockConfig(fail_every=1)) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  f"model: mock-model, tokenizer: '{tokenizer_dir}'}}")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "none")], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "all 6 request(s) of the warm-up failed" in lines[0]
    assert "HTTP 500" in lines[0]


def test_a_truncating_server_is_failures_not_successes_and_no_secret_is_stored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that cuts every other stream short: those requests fail as `truncated`, the
    metrics count only whole answers, and the API key reaches neither manifest nor result."""
    monkeypatch.setenv("INFBENCH_TEST_KEY", "sk-hunter2-secret")
    out = tmp_path / "cut"
    with MockServer(MockConfig(misbehave="truncate")) as bad:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{bad.base_url}', model: m, "
                                  f"tokenizer: '{tokenizer_dir}', api_key_env: INFBENCH_TEST_KEY}}")
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 2 and "all 6 request(s) of the warm-up failed (truncated 6)" in err
    with MockServer(MockConfig(fail_every=2)) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', model: m, "
                                  f"tokenizer: '{tokenizer_dir}', api_key_env: INFBENCH_TEST_KEY}}")
        code, _, err = run_args(["run", str(path), "--out", str(out), "--overwrite"], capsys)
    assert code == 0, err
    for file in out.iterdir():
        assert "hunter2" not in file.read_text(errors="replace"), file
    result = json.loads((out / "client_e2e_000.json").read_text())
    assert result["scenario"]["target"]["api_key_env"] == "INFBENCH_TEST_KEY"


def test_a_model_section_and_hardware_fill_the_prediction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig()) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  "model: mock-model, request_overhead_s: 0.25}",
                        extra="model: {preset: tiny}\nhardware: h100-sxm\n")
        code, _, err = run_args(["run", str(path), "--out", str(tmp_path / "p")], capsys)
    assert code == 0, err
    result = load_result(tmp_path / "p" / "client_e2e_000.json")
    assert result["prediction"]["hardware"] == "h100-sxm"
    # the served point's term is recorded and in the simulated TTFT (h100: steps of µs)
    assert result["prediction"]["request_overhead_s"] == 0.25
    assert 0.25 < result["prediction"]["metrics"]["ttft_s"]["p50"] < 0.26
    assert result["prediction"]["tpot_s"] > 0
    assert result["hardware"]["name"] == "h100-sxm"
    # No tokenizer: the prompt ids were drawn from the model section's vocabulary.
    assert result["metrics"]["num_output_tokens"] == 30


def test_slo_gives_goodput_and_plots_skip_the_roofline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    """measure.slo on a target point: goodput as for an engine run (every request 5 tokens at
    5 ms: TPOT within 50 ms, none within 1 ms), and `plots` draws what a server's results
    support (no engine steps: no roofline)."""
    config = MockConfig(token_delay_s=0.005)
    out = tmp_path / "out"
    with MockServer(config) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', "
                                  f"model: mock-model, tokenizer: '{tokenizer_dir}'}}")
        text = path.read_text().replace("measure: {warmup: 1, repeats: 2}",
                                        "measure: {warmup: 0, repeats: 1, slo: {tpot_ms: 50}}")
        path.write_text(text)
        code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
        assert code == 0, err
        strict = tmp_path / "strict.yaml"
        strict.write_text(text.replace("tpot_ms: 50", "tpot_ms: 1"))
        code, _, err = run_args(["run", str(strict), "--out", str(tmp_path / "out2")], capsys)
        assert code == 0, err
    m = load_result(out / "client_e2e_000.json")["metrics"]
    assert m["slo_attainment"] == 1.0 and m["num_slo_met"] == 6
    assert m["goodput_requests_per_s"] == pytest.approx(6 / m["wall_s"])
    assert load_result(tmp_path / "out2" / "client_e2e_000.json")["metrics"]["num_slo_met"] == 0
    code, stdout, err = run_args(["plots", str(out), "--out", str(tmp_path / "fig")], capsys)
    assert code == 0, err
    assert "no measured roofline" in err and "roofline_measured" not in stdout
    assert (tmp_path / "fig" / "latency_throughput.png").exists()
