"""`infbench run` / `report` on the shipped MoE scenarios, and bad MoE input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_mixtral_scenario_reports_routing_beside_the_roofline(monkeypatch, capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "run", str(ROOT / "scenarios/moe_mixtral.yaml"),
                           "--set", "workload.gen_len=6", "--set", "workload.prompt_len=20",
                           "--out", str(out))
    assert code == 0, err
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))
               if p.name != "manifest.json"]
    assert len(results) == 2
    for r in results:
        moe = r["metrics"]["moe"]
        steps = [s for s in r["steps"] if s["moe"] and s["moe"]["num_tokens"]]
        assert moe["steps"] == len(steps)
        assert moe["expert_bytes"] == sum(s["moe"]["expert_bytes"] for s in steps)
        expected = sum(s["moe"]["expected_bytes"] for s in steps)
        assert moe["expected_expert_bytes"] == pytest.approx(expected)
        assert moe["expert_bytes_error_pct"] == pytest.approx(
            (moe["expert_bytes"] - expected) / expected * 100)
        # uniform routing's expectation for each step's tokens (4 MoE layers, 8 experts, k 2)
        for s in steps:
            t = s["num_prefill_tokens"] + s["num_decode_tokens"]
            assert s["moe"]["expected_experts"] == pytest.approx(4 * 8 * (1 - (1 - 2 / 8) ** t))
    monkeypatch.setenv("COLUMNS", "200")  # one line per row: the headers read whole
    code, report, err = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0, err
    assert "MoE routing" in report and "roofline MB" in report
    code, rows, err = run_cli(monkeypatch, capsys, "report", str(out), "--json")
    assert code == 0, err
    by_label = {row["label"]: row for row in json.loads(rows)}
    for r in results:
        row = by_label[r["label"]]
        assert row["moe_expert_bytes"] == r["metrics"]["moe"]["expert_bytes"]
        assert row["moe_expert_bytes_error_pct"] == r["metrics"]["moe"]["expert_bytes_error_pct"]


def test_unsupported_moe_variant_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "run", str(ROOT / "scenarios/moe_mixtral.yaml"),
                           "--set", "model.overrides.moe.scoring=sparsemax",
                           "--out", str(tmp_path / "o"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert "'sparsemax'" in lines[0] and "supported: softmax, sigmoid" in lines[0]
    # The same from a checkpoint's config.json (predict reads it without torch).
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
           "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
           "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
           "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 16, "scoring_func": "sparsemax"}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli(monkeypatch, capsys, "predict", "--model", str(tmp_path / "ckpt"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "scoring_func: unsupported MoE scoring function 'sparsemax'" \
        in lines[0] and "supported: softmax, sigmoid" in lines[0]


_QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
              "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": []}


@pytest.mark.parametrize("change, message", [
    ({"mlp_only_layers": [4]}, "mlp_only_layers: must be a list of layer indices in 0..3 "
                               "(got [4])"),
    ({"mlp_only_layers": "1"}, "mlp_only_layers: must be a list of layer indices"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step: must be an integer >= 1 (got 0)"),
    ({"num_experts_per_tok": 5}, "moe.num_experts_per_tok (5) exceeds moe.num_experts (4)"),
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
])
def test_bad_qwen3_moe_config_is_one_line_exit_2(monkeypatch, capsys, tmp_path, change,
                                                 message):
    (tmp_path / "config.json").write_text(json.dumps({**_QWEN3_MOE, **change}))
    code, _, err = run_cli(monkeypatch, capsys, "predict", "--model", str(tmp_path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_qwen_moe_config_with_no_moe_layer_reads_as_dense(tmp_path):
    from infbench.checkpoint.metadata import config_from_hf_dir

    (tmp_path / "config.json").write_text(json.dumps(
        {**_QWEN3_MOE, "decoder_sparse_step": 2, "mlp_only_layers": [1, 3]}))
    cfg = config_from_hf_dir(tmp_path)
    assert cfg.moe is None and cfg.arch == "qwen3_moe" and cfg.qk_norm
