"""The client-features benchmark: its scenarios are valid against every server kind, and each
feature runs through the CLI and is summarized from its results (against the mock server
with vLLM's /metrics, so no real server is needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infbench.benchmarks import client_features as cf
from infbench.client.mock_server import MockConfig, MockServer
from infbench.scenario.loading import scenario_from_document


@pytest.mark.parametrize("kind", cf.SERVERS)
@pytest.mark.parametrize("feature", cf.FEATURES)
def test_every_scenario_is_valid(feature: str, kind: str) -> None:
    doc = cf.scenario(feature, kind, "http://127.0.0.1:1/v1", "smollm2-135m")
    (point,) = scenario_from_document(doc, "client_features").points()
    assert point.target is not None and point.target.metrics
    assert point.target.prompt_format == ("text" if kind == "llamacpp" or feature == "sessions"
                                          else "tokens")
    assert (point.target.workers == 2) == (feature in ("workers", "ray"))


def test_bad_options_are_one_line_and_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert cf.main(["--servers", "tgi", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "error: --servers: tgi; allowed: infbench, vllm, llamacpp\n")
    assert not out.exists()


def test_server_commands_serve_the_one_model_name(tmp_path: Path) -> None:
    for kind in cf.SERVERS:
        cmd = cf.server_command(kind, tmp_path, 8123, "/usr/bin/python3")
        assert cmd[cmd.index("--port") + 1] == "8123" and cf.MODEL_NAME in cmd


@pytest.mark.parametrize("feature", ["prefix", "sessions", "workers"])
def test_a_feature_runs_and_is_summarized(feature: str, tmp_path: Path) -> None:
    config = MockConfig(model=cf.MODEL_NAME, metrics="vllm", metrics_hit_fraction=0.5)
    with MockServer(config) as server:
        row = cf.run_feature(feature, "infbench", server.base_url, "smollm2-135m", tmp_path)
    assert row["ok"], row.get("error")
    # scraped from the mock's /metrics (by the parent process with workers)
    assert row["server_metrics"]["prefix_cache_hit_rate"] == pytest.approx(0.5)
    if feature == "prefix":
        assert row["requests"] == 16 and row["measured_hit_rate"] == pytest.approx(0.5)
        assert row["intended_hit_rate"] == pytest.approx(0.5, abs=0.01)
    elif feature == "sessions":
        assert (row["sessions"], row["turns"]) == ("6/6", 18)
        assert len(row["ttft_p50_ms_by_turn"]) == 3
    else:
        assert row["requests"] == 24 and row["output_tokens_per_s"] > 0


def test_a_failed_run_is_its_last_line(tmp_path: Path) -> None:
    row = cf.run_feature("prefix", "infbench", "http://127.0.0.1:1/v1", "smollm2-135m",
                         tmp_path)
    assert not row["ok"] and row["error"].startswith("exit 2: error: ")
    assert "target.base_url" in row["error"]
