"""A Qwen3-MoE checkpoint (decoder_sparse_step 2, an mlp_only_layers entry) through
`generate`, `serve`, the engine (chunked prefill, two sequences, paged blocks of 4)
and `run`: transformers' greedy tokens, and the cost model's MoE layers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_cli
from moe_checkpoints import write_hf_moe

PROMPT = [3, 17, 42, 5, 9, 61, 2, 8, 30, 11]
OTHER_PROMPT = [7, 7, 1, 90, 44, 12, 13]
NEW_TOKENS = 8
_FLAGS = ["--device", "cpu", "--dtype", "float32", "--backend", "torch"]


def _greedy(hf: Any, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                          min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("qwen3_moe")
    return root, write_hf_moe(root, "qwen3_moe", seed=7)


@pytest.fixture(scope="module")
def checkpoint(written: tuple[Path, Any]) -> tuple[Path, list[int]]:
    """The checkpoint and transformers' greedy continuation of PROMPT."""
    root, hf = written
    return root, _greedy(hf, PROMPT)


def test_engine_batch_with_chunked_prefill_is_transformers_greedy(written) -> None:
    from infbench.engine.llm import LLM
    from infbench.engine.request import SamplingParams
    from infbench.model.loader import load_model

    root, hf = written
    llm = LLM(load_model({"path": str(root)}), backend="torch", max_model_len=64,
              num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)
    outs = llm.generate([PROMPT, OTHER_PROMPT],
                        SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [_greedy(hf, PROMPT),
                                                      _greedy(hf, OTHER_PROMPT)]


def test_generate_emits_transformers_greedy_tokens(monkeypatch, capsys, checkpoint) -> None:
    root, expected = checkpoint
    code, out, err = run_cli(monkeypatch, capsys, "generate", "--model", str(root),
                             "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens",
                             str(NEW_TOKENS), "--output-ids", *_FLAGS)
    assert code == 0, err
    assert [int(t) for t in out.strip().split(",")] == expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: object) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_serve_completes_with_transformers_greedy_tokens(checkpoint) -> None:
    root, expected = checkpoint
    port = _free_port()
    exe = Path(sys.executable).with_name("infbench")
    proc = subprocess.Popen([str(exe), "serve", "--model", str(root), *_FLAGS, "--port",
                             str(port), "--max-model-len", "64", "--max-num-seqs", "2"],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"on http://127.0.0.1:{port}" in line, line
        body = _post(f"http://127.0.0.1:{port}/v1/completions",
                     {"prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0,
                      "ignore_eos": True, "return_token_ids": True})
        assert body["choices"][0]["token_ids"] == expected
    finally:
        proc.terminate()
        proc.wait(60)


def test_run_routes_through_the_moe_layers_only(monkeypatch, capsys, checkpoint,
                                                tmp_path) -> None:
    root, _ = checkpoint
    scenario = tmp_path / "q3.yaml"
    scenario.write_text(f"""
name: qwen3_moe_run
device: cpu
dtype: float32
hardware: cpu
model: {{path: {root}}}
workload: {{kind: static, batch_size: 2, prompt_len: 10, gen_len: 4, seed: 0}}
engine: {{backend: torch, block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: 0, repeats: 1}}
""")
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out", str(out))
    assert code == 0, err
    (result,) = [json.loads(p.read_text()) for p in out.glob("qwen3_moe_run_*.json")]
    steps = [s for s in result["steps"] if s["moe"] and s["moe"]["num_tokens"]]
    assert steps and result["metrics"]["moe"]["steps"] == len(steps)
    # 2 MoE layers (1 and 5 of 6), 6 experts, top 2: uniform routing's expectation
    for s in steps:
        t = s["num_prefill_tokens"] + s["num_decode_tokens"]
        assert s["moe"]["expected_experts"] == pytest.approx(2 * 6 * (1 - (1 - 2 / 6) ** t))
