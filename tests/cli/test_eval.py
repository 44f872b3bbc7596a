"""`infbench eval`: perplexity and greedy agreement from the command line.

A tiny random Llama with a byte-level tokenizer (tests/eval_checkpoint.py) loads in well
under a second, so every case here runs the real command on real text in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_args
from eval_checkpoint import write_tiny_with_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_eval"))


SMALL = ["--tokens", "200", "--window", "64", "--prompts", "3", "--new-tokens", "6"]


def test_unquantized_json(tiny_dir: Path, capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *SMALL, "--json",
                                     "--out", str(out)], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert json.loads(out.read_text()) == doc
    assert 100 < doc["perplexity"] < 400  # random weights over 256 byte tokens: near uniform
    assert doc["reference"] == "the model itself" and doc["greedy_agreement"] == 1.0
    assert doc["reference_perplexity"] == doc["perplexity"] and doc["perplexity_change"] == 0
    assert doc["tokens"] == 200 and doc["window"] == 64 and doc["quant"]["weights"] == "none"
    assert doc["backend"] in ("cpu", "torch")  # auto: the C++ kernels where they build
    assert doc["text_id"].endswith("split=test") and "CPython" in doc["text_id"]


@pytest.mark.parametrize("quant", [["--quant", "int8"],
                                   ["--quant", "int4", "--group-size", "32"],
                                   ["--quant", "int4", "--group-size", "32", "--activations",
                                    "int8"],
                                   ["--head", "int8"]],
                         ids=["int8", "int4-g32", "int4-g32-act8", "head-int8"])
def test_quantized_against_the_float_reference(tiny_dir: Path, quant: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *SMALL, *quant,
                                     "--json"], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["reference"].endswith("float32 unquantized")
    assert doc["weight_bytes"] < doc["reference_weight_bytes"]
    assert doc["perplexity_change"] == pytest.approx(
        doc["perplexity"] / doc["reference_perplexity"] - 1)
    assert doc["reference_perplexity"] != doc["perplexity"]  # the candidate really differs
    assert 0.0 <= doc["greedy_agreement"] <= 1.0
    assert doc["agreement_prompts"] == 3 and doc["agreement_tokens"] == 6
    assert doc["quant"]["activations"] == ("int8" if "--activations" in quant else "float")
    assert doc["quant"]["head"] == ("int8" if "--head" in quant else "model")


def test_table(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *SMALL,
                                     "--quant", "int8"], capsys)
    assert code == 0, stderr
    for label in ("perplexity", "reference perplexity", "perplexity change",
                  "greedy agreement", "weight bytes stored", "pydoc_data.topics"):
        assert label in stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--quant", "int3"], "--quant: unknown value 'int3'"),
    (["--quant", "int4", "--group-size", "48"], "int4 groups must be one of 32, 64, 128"),
    (["--method", "awq"], "quant.method='awq' needs quant.weights: int4"),
    (["--tokens", "0"], "--tokens: must be >= 1"),
    (["--tokens", "1"], "evaluation tokens must be >= 2"),
    (["--kv", "fp16"], "--kv: unknown value 'fp16'"),
    (["--activations", "int4"], "--activations: unknown value 'int4'"),
    (["--activations", "int8"], "quant.activations=int8 rounds the inputs of quantized"),
], ids=["bit-width", "group-size", "method", "tokens-0", "tokens-1", "kv", "act-value",
        "act-unquantized"])
def test_bad_input_is_one_line(tiny_dir: Path, capsys: pytest.CaptureFixture[str],
                               args: list[str], message: str) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *args], capsys)
    assert code == 2 and stdout == ""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], stderr
    assert "Traceback" not in stderr


def test_model_without_tokenizer_subprocess() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "infbench.cli", "eval", "--model", "tiny"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model ")
    assert "has no tokenizer" in proc.stderr and "Traceback" not in proc.stderr


def test_int8_kv_cache(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *SMALL, "--kv", "int8",
                                     "--json"], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["quant"]["kv"] == "int8" and doc["quant"]["weights"] == "none"
    assert doc["weight_bytes"] == doc["reference_weight_bytes"]  # the weights are untouched
    assert doc["perplexity"] == pytest.approx(doc["reference_perplexity"], rel=1e-2)
    assert doc["agreement_prompts"] == 3 and 0.0 <= doc["greedy_agreement"] <= 1.0


def test_fp8_kv_cache_on_a_cpu_is_the_engines_one_line(tiny_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code, stdout, stderr = run_args(["eval", "--model", str(tiny_dir), *SMALL, "--kv", "fp8",
                                     "--device", "cpu"], capsys)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and stdout == "" and len(errors) == 1
    assert "fp8 (e4m3) KV runs on CUDA GPUs only" in errors[0]
