"""`infbench prune`: prune, distill, report perplexity, write a checkpoint a scenario runs.

Runs the real command on a tiny random HF Llama with a byte-level tokenizer (seconds);
`model.prune` in a scenario runs through `infbench run` and `infbench predict` on the
tiny preset.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_args
from eval_checkpoint import write_tiny_with_tokenizer

from infbench.core.config import ModelConfig
from infbench.model.loader import load_model
from infbench.roofline.shapes import weight_bytes

SMALL = ["--eval-tokens", "300", "--calibration-tokens", "256"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_prune_cli"), num_layers=4,
                                     max_positions=512)


def test_prune_distill_json_and_the_checkpoint_runs(tiny_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pruned"
    code, stdout, stderr = run_args(["prune", "--model", str(tiny_dir), "--layers", "1",
                                     "--mlp-fraction", "0.25", "--distill-steps", "2",
                                     "--lr", "1e-3", *SMALL, "--out", str(out), "--json"],
                                    capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert set(doc["perplexity"]) == {"original", "pruned", "distilled"}
    assert all(1 < v < 1000 for v in doc["perplexity"].values())
    assert doc["prune"]["mlp_width"] == [128, 96] and len(doc["prune"]["dropped_layers"]) == 1
    assert len(doc["prune"]["layer_scores"]) == 4 and doc["distill"]["steps"] == 2
    assert [s["num_layers"] for s in doc["stages"]] == [4, 3, 3]
    assert doc["eval"]["tokens"] == 300 and doc["eval"]["text"].endswith("split=test")
    loaded = load_model({"path": str(out)})
    assert (loaded.config.num_layers, loaded.config.intermediate_size) == (3, 96)
    assert loaded.weight_bytes == doc["stages"][-1]["weight_bytes"]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"""
name: pruned_ckpt
device: cpu
dtype: float32
hardware: cpu
model: {{path: {out}}}
workload: {{kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}}
engine: {{block_size: 4, max_num_batched_tokens: 32}}
measure: {{warmup: 0, repeats: 1}}
""")
    code, stdout, stderr = run_args(["run", str(scenario), "--out", str(tmp_path / "run"),
                                     "--json"], capsys)
    assert code == 0, stderr


def test_table_output(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_args(["prune", "--model", str(tiny_dir), "--mlp-fraction", "0.5",
                                     *SMALL, "--out", str(tmp_path / "o")], capsys)
    assert code == 0, stderr
    assert "original" in stdout and "pruned" in stdout and "distilled" not in stdout
    assert "MLP width" in stdout and "wrote" in stdout


@pytest.mark.parametrize("args, message", [
    (["--layers", "4"], "--layers 4: model"),
    (["--mlp-fraction", "1"], "--mlp-fraction: must be in [0, 1)"),
    (["--mlp-fraction", "-0.1"], "--mlp-fraction: must be in [0, 1)"),
    (["--lr", "0"], "--lr: must be a finite number > 0"),
    (["--distill-steps", "-1"], "--distill-steps: must be >= 0"),
], ids=["layers-all", "fraction-1", "fraction-negative", "lr-0", "steps-negative"])
def test_bad_input_is_one_line_exit_2(tiny_dir: Path, tmp_path: Path, args: list[str],
                                      message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_args(["prune", "--model", str(tiny_dir), *args,
                                     "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("error: ") and message in stderr
    assert not (tmp_path / "o").exists()


def test_model_without_tokenizer_and_occupied_out(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, stderr = run_args(["prune", "--model", "tiny", "--layers", "1", "--out",
                                str(tmp_path / "o")], capsys)
    assert code == 2 and stderr.count("\n") == 1 and "no tokenizer" in stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    code, _, stderr = run_args(["prune", "--model", "tiny", "--out", str(busy)], capsys)
    assert code == 2 and stderr.count("\n") == 1 and "--overwrite" in stderr
    code, _, stderr = run_args(["prune", "--model", "tiny-mla", "--out", str(tmp_path / "m")],
                               capsys)
    assert code == 2 and stderr.count("\n") == 1 and "Hugging Face checkpoint" in stderr


def test_scenario_prune_runs_and_predict_prices_the_pruned_shape(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "p.yaml"
    scenario.write_text("""
name: pruned_preset
device: cpu
dtype: float32
hardware: cpu
model: {preset: tiny, overrides: {num_layers: 3, max_seq_len: 64},
        prune: {layers: 1, mlp_fraction: 0.5, calibration_tokens: 64}}
workload: {kind: static, batch_size: 2, prompt_len: 8, gen_len: 4, seed: 0}
engine: {block_size: 4, max_num_batched_tokens: 32}
measure: {warmup: 0, repeats: 1}
""")
    code, stdout, stderr = run_args(["run", str(scenario), "--out", str(tmp_path / "run"),
                                     "--json"], capsys)
    assert code == 0, stderr
    files = [p for p in (tmp_path / "run").rglob("*.json") if p.name != "manifest.json"]
    docs = [json.loads(p.read_text()) for p in files]
    result = next(d for d in docs if "model_config" in d)
    assert result["model_config"]["num_layers"] == 2
    assert result["model_config"]["intermediate_size"] == 64
    assert result["scenario"]["model"]["prune"]["layers"] == 1
    code, stdout, stderr = run_args(["predict", str(scenario), "--json"], capsys)
    assert code == 0, stderr
    predicted = json.loads(stdout)[0]
    shape = ModelConfig.from_name("tiny").with_overrides(num_layers=2, max_seq_len=64,
                                                         intermediate_size=64)
    assert predicted["weight_bytes"] == weight_bytes(shape, "float32")
    assert predicted["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # layers x (k, v) x heads x dim
    bad = tmp_path / "bad.yaml"
    bad.write_text(scenario.read_text().replace("layers: 1,", "layers: 3,"))
    code, _, stderr = run_args(["predict", str(bad)], capsys)
    assert code == 2 and stderr.count("\n") == 1 and "prune.layers (3)" in stderr
