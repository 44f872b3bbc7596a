"""fp8 / mxfp4 / nvfp4 weights through `run`, `generate` and `serve`: the weight bytes a run
records are the stored bytes, a native fp8 checkpoint's run is priced as it is stored, and
generate / serve produce the float twin's greedy tokens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import run_cli
from fp_checkpoints import write_fp_checkpoint

from infbench.core.config import QuantConfig
from infbench.model.loader import load_model

PROMPT = "3,17,42,5,9,61,2,8"
_FLAGS = ["--device", "cpu", "--dtype", "float32", "--backend", "torch"]


def _run(tmp_path, monkeypatch, capsys, model: str) -> dict:
    scenario = tmp_path / "fp.yaml"
    scenario.write_text(f"""
name: fp_tiny
device: cpu
dtype: float32
hardware: cpu
model: {model}
workload: {{kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32, backend: torch}}
measure: {{warmup: 0, repeats: 1}}
""")
    out = tmp_path / "out"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out", str(out))
    assert code == 0, err
    return json.loads(next(out.glob("fp_tiny_*.json")).read_text())


def test_run_records_the_stored_bytes(tmp_path, monkeypatch, capsys):
    result = _run(tmp_path, monkeypatch, capsys, "{preset: tiny, overrides: {max_seq_len: 64}, "
                  "quant: {weights: nvfp4, activations: fp4}}")
    assert result["scenario"]["model"]["quant"]["weights"] == "nvfp4"
    loaded = load_model({"preset": "tiny"}, overrides={"max_seq_len": 64},
                        quant=QuantConfig(weights="nvfp4"))
    assert result["metrics"]["weight_bytes"] == loaded.weight_bytes


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """A DeepSeek-V3-style fp8 checkpoint with 128x128 blocks (the priced block size)."""
    root = tmp_path_factory.mktemp("fp8")
    quant_dir, twin_dir = write_fp_checkpoint(root, "deepseek-block", block=128)
    return quant_dir, twin_dir


def test_run_native_checkpoint_is_priced_as_stored(tmp_path, monkeypatch, capsys,
                                                   fp8_checkpoint):
    quant_dir, _ = fp8_checkpoint
    result = _run(tmp_path, monkeypatch, capsys,
                  f"{{path: {quant_dir}, quant: {{weights: native}}}}")
    stored = load_model({"path": str(quant_dir)}, quant=QuantConfig(weights="native"))
    assert result["metrics"]["weight_bytes"] == stored.weight_bytes
    assert result["prediction"]["weight_bytes"] == pytest.approx(stored.weight_bytes, rel=1e-3)


def _generate(monkeypatch, capsys, model: Path) -> str:
    code, out, err = run_cli(monkeypatch, capsys, "generate", "--model", str(model),
                             "--prompt-ids", PROMPT, "--max-tokens", "6", "--output-ids",
                             *_FLAGS)
    assert code == 0, err
    return out.strip()


def test_generate_dequantizes_to_the_twin(monkeypatch, capsys, fp8_checkpoint):
    quant_dir, twin_dir = fp8_checkpoint
    assert _generate(monkeypatch, capsys, quant_dir) == _generate(monkeypatch, capsys, twin_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_native_checkpoint(monkeypatch, capsys, fp8_checkpoint):
    quant_dir, twin_dir = fp8_checkpoint
    expected = [int(t) for t in _generate(monkeypatch, capsys, twin_dir).replace(",", " ").split()]
    port = _free_port()
    exe = Path(sys.executable).with_name("infbench")
    proc = subprocess.Popen([str(exe), "serve", "--model", str(quant_dir), "--quant", "native",
                             *_FLAGS, "--port", str(port), "--max-model-len", "64",
                             "--max-num-seqs", "2"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"on http://127.0.0.1:{port}" in line, line
        body = json.dumps({"prompt": [int(t) for t in PROMPT.split(",")], "max_tokens": 6,
                           "temperature": 0, "ignore_eos": True,
                           "return_token_ids": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            got = json.loads(resp.read())["choices"][0]["token_ids"]
        # the twin holds the dequantized weights: the same greedy tokens
        assert got == expected[:len(got)] and len(got) == 6
    finally:
        proc.terminate()
        proc.wait(60)
