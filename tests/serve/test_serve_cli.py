"""`infbench serve`: bad input is one line and exit 2; the model and scenario paths build
the engine asked for; a real process serves, then exits 0 on SIGTERM after finishing
the request in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import run_args

from infbench.commands import serve as serve_cmd


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --model NAME or --scenario FILE"),
    (["--model", "tiny", "--scenario", "x.yaml"], "not both"),
    (["--scenario", "x.yaml", "--max-num-seqs", "4"], "--max-num-seqs: with --scenario"),
    (["--scenario", "x.yaml", "--kv-quant", "int8"], "--kv-quant: with --scenario"),
    (["--model", "tiny", "--port", "70000"], "--port"),
    (["--model", "tiny", "--max-queue", "-1"], "--max-queue"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "tiny", "--max-model-len", "5000", "--device", "cpu"], "--max-model-len 5000"),
    (["--model", "tiny", "--device", "cpu", "--kv-cache-memory", "1e30"],
     "--kv-cache-memory 1e+30: more bytes than this machine has free"),
    (["--model", "tiny", "--device", "cpu", "--kv-cache-memory", "1e12", "--replicas", "2"],
     "--kv-cache-memory x 2 replicas"),
    (["--model", "tiny", "--device", "cpu", "--num-kv-blocks", "10000000000"],
     "--num-kv-blocks 10000000000: at most 16777216"),
    (["--model", "tiny", "--max-num-seqs", str(2**24 + 1)], "--max-num-seqs 16777217: at most"),
    (["--model", "tiny", "--max-queue", str(2**30)], "--max-queue 1073741824: at most"),
    (["--model", "tiny", "--max-connections", "100000000"], "ulimit -n"),
    (["--model", "tiny", "--max-request-bytes", str(1 << 50)], "--max-request-bytes"),
    (["--model", "tiny", "--num-threads", "100000"], "--num-threads 100000: this machine"),
    (["--model", "tiny", "--replicas", "100000"], "--replicas 100000: this machine"),
    (["--model", "tiny", "--shutdown-timeout", "1e9"], "--shutdown-timeout 1e+09: at most"),
    (["--model", "tiny", "--shutdown-timeout", "nan"], "--shutdown-timeout"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_args(["serve", *args], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_sizes_are_checked_against_the_free_memory(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    free = 1 << 30  # as if this machine had 1 GiB free
    monkeypatch.setattr(serve_cmd, "_free_ram", lambda: free)
    monkeypatch.setattr(serve_cmd, "_free_memory", lambda device: ("this machine", free))
    for args, message in (
            (["--kv-cache-memory", "2e9"], "--kv-cache-memory 2e+09: more bytes than this "
                                           "machine has free (1.0 GiB)"),
            (["--num-kv-blocks", "1000000"], "--num-kv-blocks 1000000: the KV pool would take"),
            (["--max-request-bytes", str(200 << 20)], "would take over half the free memory")):
        code, out, err = run_args(["serve", "--model", "tiny", "--device", "cpu", "--backend",
                                   "torch", *args], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_model_flags_and_scenario_build_the_engine(tmp_path: Path) -> None:
    engine, loaded, label = serve_cmd._from_flags(
        "tiny", dtype="float32", device="cpu", seed=0, random_weights=False, quant="none",
        kv_quant="none", engine_flags={"--max-num-seqs": 3, "--max-num-batched-tokens": 32,
                                       "--kv-cache-memory": None, "--backend": "torch",
                                       "--num-threads": None},
        num_kv_blocks=None, max_model_len=64)
    assert label == "tiny" and loaded.config.name == "tiny"
    assert engine.engine_cfg.max_num_seqs == 3 and engine.ops.name == "torch"
    assert engine.kv.num_blocks * engine.engine_cfg.block_size >= 3 * 64
    scenario = tmp_path / "s.yaml"
    scenario.write_text("""
name: serve_test
device: cpu
dtype: float32
model: {preset: tiny, overrides: {max_seq_len: 96}}
workload: {kind: static, batch_size: [1, 2], prompt_len: 8, gen_len: 4}
engine: {block_size: 8, max_num_seqs: 2, max_num_batched_tokens: 48}
""")
    engine, loaded, label = serve_cmd._from_scenario(scenario, "auto", None, None)
    assert label == "tiny" and loaded.config.max_seq_len == 96
    assert (engine.engine_cfg.block_size, engine.engine_cfg.max_num_seqs) == (8, 2)
    swept = tmp_path / "sweep.yaml"
    swept.write_text(scenario.read_text() + "sweep:\n  model.overrides.max_seq_len: [64, 96]\n")
    with pytest.raises(Exception, match="serve runs one model and engine"):
        serve_cmd._from_scenario(swept, "auto", None, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: object) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _running(url: str) -> bool:
    """The engine runs a sequence (from /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return any(line.startswith("infbench:num_requests_running{") and not line.endswith(" 0")
               for line in text.splitlines())


def test_serve_process_answers_and_stops_cleanly_on_sigterm() -> None:
    port = _free_port()
    exe = Path(sys.executable).with_name("infbench")
    proc = subprocess.Popen(
        [str(exe), "serve", "--model", "tiny", "--device", "cpu", "--dtype", "float32",
         "--backend", "torch", "--port", str(port), "--max-model-len", "1024",
         "--max-num-seqs", "2", "--served-model-name", "tiny-cli"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"on http://127.0.0.1:{port}" in line, line
        url = f"http://127.0.0.1:{port}"
        body = _post(url + "/v1/completions", {"model": "tiny-cli", "prompt": [1, 2, 3],
                                               "max_tokens": 4})
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                 "total_tokens": 7}
        # SIGTERM while a long request is in flight: it still finishes, then exit 0.
        result: dict[str, object] = {}
        worker = threading.Thread(target=lambda: result.update(_post(
            url + "/v1/completions", {"prompt": [5, 6], "max_tokens": 1000, "ignore_eos": True})))
        worker.start()
        deadline = time.monotonic() + 30
        while not _running(url) and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        worker.join(60)
        assert proc.wait(60) == 0
        assert result["usage"]["completion_tokens"] == 1000  # type: ignore[index]
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
