"""`infbench train-draft`: trains heads on a tiny random HF Llama with a byte-level tokenizer
(seconds), writes a file `load_draft_heads` reads back, and refuses bad input with one
`error:` line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args
from eval_checkpoint import write_tiny_with_tokenizer

from infbench.model.draft_heads import EagleHead, MedusaHeads
from infbench.model.draft_train import load_draft_heads, read_draft_file
from infbench.model.loader import load_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny-draft-cli") / "tiny-llama")


def test_medusa_json_writes_a_loadable_file(tiny_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "heads" / "m.safetensors"
    code, stdout, stderr = run_args(["train-draft", "--method", "medusa", "--model",
                                     str(tiny_dir), "--steps", "3", "--num-heads", "2",
                                     "--lr", "3e-3", "--seed", "1", "--sequences", "12",
                                     "--out", str(out), "--json"], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["method"] == "medusa" and doc["steps"] == 3 and doc["num_heads"] == 2
    assert doc["out"] == str(out) and doc["seed"] == 1 and doc["lr"] == 3e-3
    assert len(doc["train_losses"]) == 3 and len(doc["head_accuracy"]) == 2
    assert doc["train_positions"] == 4 * 64 and doc["heldout_positions"] > 0
    assert doc["data"]["sequences"] == 12 and doc["data"]["heldout_sequences"] == 8
    assert doc["data"]["text"].endswith("split=calibration")
    assert "step 3/3" in stderr
    meta, _ = read_draft_file(out)
    assert meta["method"] == "medusa" and meta["num_heads"] == "2" and meta["steps"] == "3"
    assert float(meta["final_loss"]) == doc["final_loss"]
    heads = load_draft_heads(out, load_model({"path": str(tiny_dir)}).model)
    assert isinstance(heads, MedusaHeads) and heads.num_heads == 2


def test_eagle_table_and_default_out(tiny_dir: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_args(["train-draft", "--method", "eagle", "--model",
                                     str(tiny_dir), "--steps", "2"], capsys)
    assert code == 0, stderr
    out = Path("results/draft-heads/eagle-tiny-llama.safetensors")
    assert "before training" in stdout and "after 2 steps" in stdout and str(out) in stdout
    assert isinstance(load_draft_heads(out, load_model({"path": str(tiny_dir)}).model),
                      EagleHead)


@pytest.mark.parametrize("args, needle", [
    (["--method", "lookahead", "--steps", "1"], "--method: unknown value 'lookahead'; "
                                                "allowed: medusa, eagle"),
    (["--method", "medusa", "--steps", "0"], "--steps: must be >= 1 (got 0)"),
    (["--method", "medusa", "--steps", "1", "--num-heads", "0"],
     "--num-heads: must be >= 1 (got 0)"),
    (["--method", "eagle", "--steps", "1", "--num-heads", "2"],
     "--num-heads: only --method medusa"),
    (["--method", "medusa", "--steps", "1", "--lr", "nan"], "--lr: must be a finite number"),
    (["--method", "medusa"], "--steps"),
    (["--method", "medusa", "--steps", "1", "--sequences", "8"],
     "--sequences 8: 8 sequences are held out; allowed: 9 or more"),
], ids=["method", "steps-0", "heads-0", "heads-eagle", "lr-nan", "no-steps", "sequences"])
def test_bad_input_is_one_line_exit_2(tiny_dir: Path, tmp_path: Path, args: list[str],
                                      needle: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_args(["train-draft", "--model", str(tiny_dir), *args], capsys)
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("error: ") and needle in stderr
    assert not (tmp_path / "results").exists()


def test_model_without_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_args(["train-draft", "--method", "medusa", "--model", "tiny",
                                "--steps", "1"], capsys)
    assert code == 2 and stderr.splitlines()[-1].startswith("error: ")
    assert "no tokenizer" in stderr and not (tmp_path / "results").exists()
