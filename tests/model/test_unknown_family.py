"""A config.json of a family infbench does not know: one line naming its model_type, its
architectures entry and the known families (predict, kv, run), exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from infbench.checkpoint.metadata import HF_ARCHITECTURES, config_from_hf_dir, known_families
from infbench.core.errors import UserError


def _ckpt(tmp_path: Path, **raw: object) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"hidden_size": 64, **raw}))
    return d


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _assert_lists_families(line: str) -> None:
    for model_type, cls in known_families().items():
        assert f"{model_type} ({cls})" in line


def test_known_families_come_from_the_one_registry() -> None:
    families = known_families()
    # every registered class appears exactly once, under the model_type a config would name
    assert sorted(families.values()) == sorted(HF_ARCHITECTURES)
    assert families["gemma3_text"] == "Gemma3ForCausalLM" and "gemma3" not in families
    assert families["qwen2_moe"] == "Qwen2MoeForCausalLM"


@pytest.mark.parametrize("command", [["predict", "--model"], ["kv", "--model"]])
def test_unknown_architecture_is_refused_by_predict_and_kv(monkeypatch, capsys, tmp_path,
                                                           command):
    d = _ckpt(tmp_path, architectures=["FooForCausalLM"], model_type="foo")
    code, _, err = run_cli(monkeypatch, capsys, *command, str(d))
    assert code == 2
    line = _one_error_line(err)
    assert f"{d / 'config.json'}: architectures: unknown model family 'FooForCausalLM'" in line
    assert "(model_type 'foo')" in line
    _assert_lists_families(line)


def test_unknown_family_is_refused_by_run(monkeypatch, capsys, tmp_path):
    d = _ckpt(tmp_path, architectures=["FooForCausalLM"], model_type="foo")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"""
name: unknown_family
device: cpu
dtype: float32
hardware: cpu
model: {{path: {d}}}
workload: {{kind: static, batch_size: 1, prompt_len: 4, gen_len: 2}}
""")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(scenario), "--out",
                           str(tmp_path / "o"))
    assert code == 2
    line = _one_error_line(err)
    assert "unknown model family 'FooForCausalLM' (model_type 'foo')" in line
    _assert_lists_families(line)
    assert not (tmp_path / "o").exists()


def test_unknown_model_type_without_architectures(tmp_path: Path) -> None:
    d = _ckpt(tmp_path, model_type="falcon_h1")
    with pytest.raises(UserError) as exc:
        config_from_hf_dir(d)
    msg = str(exc.value)
    assert "config.json: model_type: unknown model family no class (model_type 'falcon_h1')" \
        in msg
    _assert_lists_families(msg)


def test_known_model_type_without_architectures_is_read(tmp_path: Path) -> None:
    d = _ckpt(tmp_path, model_type="qwen2_moe", vocab_size=64, num_hidden_layers=2,
              intermediate_size=64, num_attention_heads=4, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=16)
    cfg = config_from_hf_dir(d)
    assert cfg.arch == "qwen2_moe" and cfg.moe is not None and cfg.moe.num_experts == 4
