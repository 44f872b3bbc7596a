"""Every target setting checked before anything is written: a tokenizer that cannot be loaded
when the scenario loads, an unreachable or key-refusing server by one GET /models probe
before `infbench run` claims its output directory (one `error:` line, exit 2)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from cli_helpers import run_args
from test_target_cli import scenario

from infbench.client.mock_server import MockConfig, MockServer
from infbench.core.errors import UserError
from infbench.measure.preflight import probe_target
from infbench.scenario.target import TargetSection


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path,
                    message: str) -> str:
    out = tmp_path / "out"
    code, _, err = run_args(["run", str(path), "--out", str(out)], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not out.exists()  # refused before the run directory was claimed
    return lines[0]


@pytest.mark.parametrize(("tokenizer", "message"), [
    ("{missing}", "target.tokenizer: '{missing}' is no tokenizer preset and no existing "
                  "directory or file; allowed: smollm2-135m, an HF directory with "
                  "tokenizer.json, or a .gguf file"),
    ("{missing}.gguf", "target.tokenizer: GGUF file"),
    ("tiny", "target.tokenizer: preset 'tiny' has no tokenizer; allowed: smollm2-135m"),
    ("{empty_dir}", "target.tokenizer: {empty_dir}: no tokenizer.json"),
])
def test_a_tokenizer_that_cannot_be_loaded_is_refused_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: str,
        message: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    names = {"missing": str(tmp_path / "no_such_tokenizer"), "empty_dir": str(empty)}
    path = scenario(tmp_path, f"{{kind: openai, base_url: 'http://127.0.0.1:{closed_port()}/v1',"
                              f" model: m, tokenizer: '{tokenizer.format(**names)}'}}")
    line = _one_error_line(tmp_path, capsys, path, message.format(**names))
    assert line.startswith(f"error: {path}: ")
    assert "no server answered" not in line  # the scenario's check, before any probe


def test_an_unreachable_base_url_is_refused_before_the_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path) -> None:
    port = closed_port()
    path = scenario(tmp_path, f"{{kind: openai, base_url: 'http://127.0.0.1:{port}/v1', "
                              f"model: m, tokenizer: '{tokenizer_dir}'}}")
    line = _one_error_line(tmp_path, capsys, path, "target.base_url: no server answered GET "
                                                   f"http://127.0.0.1:{port}/v1/models within "
                                                   "5 s")
    assert "start the server or fix target.base_url; nothing was measured" in line


def test_a_probe_answered_401_names_api_key_env(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with MockServer(MockConfig(api_key="sk-right")) as server:
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', model: m, "
                                  f"tokenizer: '{tokenizer_dir}'}}")
        _one_error_line(tmp_path, capsys, path, "target.api_key_env: the server at "
                                                f"{server.base_url}/models asks for an API key "
                                                "(HTTP 401)")
        monkeypatch.setenv("INFBENCH_TEST_KEY", "sk-wrong")
        path = scenario(tmp_path, f"{{kind: openai, base_url: '{server.base_url}', model: m, "
                                  f"tokenizer: '{tokenizer_dir}', "
                                  "api_key_env: INFBENCH_TEST_KEY}")
        line = _one_error_line(tmp_path, capsys, path, "refused the key in INFBENCH_TEST_KEY "
                                                       "(HTTP 401)")
        assert "sk-wrong" not in line
        monkeypatch.setenv("INFBENCH_TEST_KEY", "sk-right")
        section = TargetSection(kind="openai", base_url=server.base_url, model="m",
                                api_key_env="INFBENCH_TEST_KEY")
        probe_target(section, "here")  # the right key: the server is there


def test_the_probe_passes_a_server_that_is_there_even_with_an_error_status(
        tmp_path: Path) -> None:
    with MockServer(MockConfig()) as server:
        probe_target(TargetSection(kind="openai", base_url=server.base_url, model="m"), "here")
        # /v2/models is a 404 from the mock: a server answered, so the run goes on
        probe_target(TargetSection(kind="openai", base_url=server.base_url[:-3] + "/v2",
                                   model="m"), "here")
    with pytest.raises(UserError, match=r"^here: target.base_url: no server answered"):
        probe_target(TargetSection(kind="openai", base_url=f"http://127.0.0.1:{closed_port()}",
                                   model="m"), "here", timeout_s=1.0)
