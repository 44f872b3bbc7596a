"""Llama-4 (llama4_text) config.json -> ModelConfig, its parameter counts and its KV cache.

Configs are written by transformers (Llama4TextConfig / Llama4Config.save_pretrained);
parameter counts are checked against transformers' model of the same config on the meta
device, the presets against the same reader, and the KV accounting against the chunked
layers' cap (min(context, chunk) tokens; NoPE layers keep the whole context).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_args

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.core.config import AttentionConfig, ModelConfig
from infbench.core.errors import ConfigError, UserError
from infbench.roofline.layer_costs import attended_pairs, kv_tokens_read
from infbench.roofline.shapes import kv_bytes_per_token, kv_cache_bytes, param_count

TINY: dict[str, Any] = dict(
    vocab_size=128, hidden_size=32, intermediate_size=16, intermediate_size_mlp=48,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
    attention_chunk_size=8, no_rope_layer_interval=2, max_position_embeddings=256,
    floor_scale=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# The published text_config of meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E
_LLAMA4 = dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192,
               intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, num_experts_per_tok=1,
               attention_chunk_size=8192)
SCOUT = dict(_LLAMA4, num_local_experts=16, interleave_moe_layer_step=1, use_qk_norm=True,
             max_position_embeddings=10485760, rope_parameters=dict(
                 rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                 original_max_position_embeddings=8192, rope_theta=500000.0))
MAVERICK = dict(_LLAMA4, num_local_experts=128, interleave_moe_layer_step=2,
                use_qk_norm=False, max_position_embeddings=1048576)


def write_config(tmp: Path, multimodal: bool = False, **overrides: Any) -> Path:
    """Save a Llama4TextConfig (or a Llama4Config around it) into `tmp`; return `tmp`."""
    from transformers import Llama4Config, Llama4TextConfig

    text = Llama4TextConfig(**{**TINY, **overrides})
    (Llama4Config(text_config=text.to_dict()) if multimodal else text).save_pretrained(tmp)
    return tmp


def edit_config(root: Path, **changes: Any) -> Path:
    raw = json.loads((root / "config.json").read_text())
    raw.update(changes)
    (root / "config.json").write_text(json.dumps(raw))
    return root


def test_tiny_config_reads_every_llama4_feature(tmp_path: Path) -> None:
    cfg = config_from_hf_dir(write_config(tmp_path))
    assert cfg.arch == "llama4" and cfg.intermediate_size == 48
    assert cfg.nope_layers == (1, 3) and cfg.attention_chunk == 8 and cfg.qk_l2_norm
    assert (cfg.attn_temperature_floor, cfg.attn_temperature_scale) == (4, 0.1)
    moe = cfg.moe
    assert moe is not None and moe.scale_input and moe.scoring == "sigmoid"
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (4, 1, 16)
    assert moe.shared_size == 16 and not moe.norm_topk_prob
    assert [moe.is_moe(i) for i in range(4)] == [False, True, False, True]
    specs = cfg.layers()
    assert [(s.chunk, s.rope) for s in specs] == [(8, True), (None, False)] * 2
    assert [s.kv_span for s in specs] == [8, None, 8, None]


def test_multimodal_config_reads_its_text_config(tmp_path: Path) -> None:
    text = config_from_hf_dir(write_config(tmp_path / "text"))
    both = config_from_hf_dir(write_config(tmp_path / "text", multimodal=True))
    assert json.loads((tmp_path / "text" / "config.json").read_text())["model_type"] == "llama4"
    assert both == text


def test_irregular_moe_layers_and_no_chunking(tmp_path: Path) -> None:
    root = write_config(tmp_path, moe_layers=[0, 3], attention_chunk_size=None,
                        no_rope_layers=[1, 1, 1, 1], attn_temperature_tuning=False)
    cfg = config_from_hf_dir(root)
    assert cfg.moe is not None
    assert [cfg.moe.is_moe(i) for i in range(4)] == [True, False, False, True]
    assert cfg.nope_layers == () and cfg.attention_chunk is None
    assert cfg.attn_temperature_floor is None
    assert all(s.chunk is None and s.rope for s in cfg.layers())


def _meta_count(values: dict[str, Any]) -> int:
    from transformers import AutoModelForCausalLM, Llama4TextConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Llama4TextConfig(**values))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("preset", "values", "total_b", "experts"), [
    ("llama-4-scout", SCOUT, 107.77, 16), ("llama-4-maverick", MAVERICK, 400.71, 128)])
def test_presets_match_the_published_configs_and_transformers_counts(
        tmp_path: Path, preset: str, values: dict[str, Any], total_b: float,
        experts: int) -> None:
    from transformers import Llama4TextConfig

    Llama4TextConfig(**values).save_pretrained(tmp_path)
    read = config_from_hf_dir(tmp_path)
    cfg = ModelConfig.from_name(preset)
    assert read.layers() == cfg.layers() and read.moe == cfg.moe
    assert read.rope_scaling == cfg.rope_scaling and read.rope_theta == cfg.rope_theta
    assert read.qk_l2_norm == cfg.qk_l2_norm and read.max_seq_len == cfg.max_seq_len
    count = param_count(cfg)
    assert count.total == pytest.approx(_meta_count(values), rel=0.01)
    # The model cards: 17B active (the embedding included), 16 / 128 experts; the totals
    # (109B / 400B) also count the vision encoder, which is not part of the text model.
    assert count.total / 1e9 == pytest.approx(total_b, abs=0.01)
    assert (count.active + count.embedding) / 1e9 == pytest.approx(17.0, rel=0.02)
    assert cfg.moe is not None and cfg.moe.num_experts == experts


def test_kv_cache_caps_the_chunked_layers_at_the_chunk() -> None:
    from infbench.roofline.tables import scheme_name

    cfg = ModelConfig.from_name("llama-4-scout")
    assert scheme_name(cfg) == "gqa-8 chunk-8192/nope-12"
    per_layer = 2 * 8 * 128 * 2  # K and V, 8 KV heads of 128, bfloat16
    assert kv_bytes_per_token(cfg, "bfloat16") == 48 * per_layer
    # 12 NoPE layers hold the context, 36 chunked layers min(context, 8192)
    assert kv_cache_bytes(cfg, "bfloat16", None, 131072, 2) == 2 * per_layer * (
        12 * 131072 + 36 * 8192)
    assert kv_cache_bytes(cfg, "bfloat16", None, 4096, 1) == 48 * per_layer * 4096


def _loop_pairs(context: int, queries: int, chunk: int) -> tuple[int, int]:
    seen = [range(t - t % chunk, t + 1) for t in range(context - queries, context)]
    return sum(len(r) for r in seen), len(set().union(*seen))


def test_chunked_pair_and_key_counts_match_a_loop() -> None:
    from kernels import _paged_attention as kernel_counts

    for chunk in (1, 3, 8):
        for context in range(1, 30):
            for queries in range(1, context + 1):
                expected = _loop_pairs(context, queries, chunk)
                got = (attended_pairs(context, queries, None, chunk),
                       kv_tokens_read(context, queries, None, chunk))
                assert got == expected
                assert got == (kernel_counts.attended_pairs(context, queries, None, chunk),
                               kernel_counts.kv_tokens_read(context, queries, None, chunk))


def test_predict_prices_the_chunked_decode_exactly() -> None:
    """Decode attends (t % chunk) + 1 keys: the mean over a range crossing a chunk
    boundary equals the mean of the per-context step costs."""
    from infbench.core.config import QuantConfig
    from infbench.hardware.spec import get_hardware
    from infbench.roofline.analysis import mean_stage
    from infbench.roofline.costs import group_costs
    from infbench.roofline.ops import SeqWork

    cfg = ModelConfig.from_name("llama-4-scout").with_overrides(attention_chunk=16)
    hw, quant = get_hardware("h100-sxm"), QuantConfig()
    mean = mean_stage(cfg, hw, "bfloat16", quant, lambda x: [(SeqWork(1, x), 2)], 1, 5, 40)
    reads = [sum(op.kv_read_bytes for op in group_costs(cfg, [(SeqWork(1, x), 2)],
                                                        "bfloat16", quant, stage="decode"))
             for x in range(5, 41)]
    assert mean.cost.kv_read_bytes == pytest.approx(sum(reads) / len(reads), rel=1e-9)


@pytest.mark.parametrize(("changes", "message"), [
    (dict(hidden_act="gelu"), "hidden_act 'gelu' unsupported for llama4"),
    (dict(attention_bias=True), "attention_bias=true is not supported"),
    (dict(no_rope_layers=[1, 0]), "no_rope_layers: must list 1 (RoPE) or 0 (NoPE) for each"),
    (dict(no_rope_layers=[1, 2, 1, 0]), "no_rope_layers: must list 1 (RoPE) or 0"),
    (dict(layer_types=["full_attention"] * 4), "layer_types"),
    (dict(moe_layers=[0, 9]), "moe_layers: layer indices must be in 0..3"),
    (dict(attention_chunk_size=0), "attention_chunk_size: must be an integer >= 1"),
    (dict(attn_scale=-1.0), "attn_scale: must be a finite number >= 0"),
])
def test_reader_refuses_what_it_cannot_run(tmp_path: Path, changes: dict[str, Any],
                                           message: str) -> None:
    root = edit_config(write_config(tmp_path), **changes)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_hf_dir(root)


def test_multimodal_config_without_text_config_is_refused(tmp_path: Path) -> None:
    root = write_config(tmp_path, multimodal=True)
    raw = json.loads((root / "config.json").read_text())
    del raw["text_config"]
    (root / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="needs a text_config"):
        config_from_hf_dir(root)


def test_cli_refusal_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = edit_config(write_config(tmp_path), no_rope_layers=[1, 0])
    code, _, err = run_args(["kv", "--models", str(root), "--context", "64"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "no_rope_layers" in errors[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(("fields", "message"), [
    (dict(nope_layers=(4,)), "model.nope_layers"),
    (dict(nope_layers=(1, 1)), "lists a layer twice"),
    (dict(attention_chunk=0), "model.attention_chunk must be"),
    (dict(attention_chunk=8, attention=AttentionConfig(kind="sliding", window=4)),
     "needs plain softmax attention"),
    (dict(qk_l2_norm=True, qk_norm=True), "two q/k norms"),
    (dict(attn_temperature_floor=0), "model.attn_temperature_floor"),
])
def test_model_config_checks_the_llama4_fields(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig(num_layers=4, **fields)
