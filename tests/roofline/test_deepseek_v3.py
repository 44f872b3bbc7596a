"""DeepSeek-V3 / Kimi-K2: config.json reading, parameter counts against transformers, KV bytes,
the MTP module's count and the refusals (docs/architectures.md, docs/moe.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.core.config import PRESETS, ModelConfig
from infbench.core.errors import ConfigError, UserError
from infbench.roofline.shapes import kv_bytes_per_token, mtp_weights, param_count

# deepseek-ai/DeepSeek-V3's config.json (the keys that shape the model), as published.
V3_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "tie_word_embeddings": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}


def _write(tmp: Path, raw: dict[str, Any]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    return tmp


def _hf_config(p: ModelConfig) -> Any:
    import transformers

    a, moe = p.attention, p.moe
    assert moe is not None
    return transformers.DeepseekV3Config(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        moe_intermediate_size=moe.moe_intermediate_size, num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads, num_key_value_heads=p.num_heads,
        n_shared_experts=moe.num_shared_experts, n_routed_experts=moe.num_experts,
        kv_lora_rank=a.kv_lora_rank, q_lora_rank=a.q_lora_rank,
        qk_rope_head_dim=a.qk_rope_head_dim, qk_nope_head_dim=a.qk_nope_head_dim,
        v_head_dim=a.v_head_dim, n_group=moe.n_group, topk_group=moe.topk_group,
        num_experts_per_tok=moe.num_experts_per_tok, first_k_dense_replace=moe.first_k_dense,
        max_position_embeddings=64)


def _meta_count(module: Any) -> int:
    """Parameters plus the routers' e_score_correction_bias buffers (stored in checkpoints)."""
    biases = [b for n, b in module.named_buffers() if n.endswith("e_score_correction_bias")]
    return sum(t.numel() for t in module.parameters()) + sum(b.numel() for b in biases)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_parameter_count_equals_transformers_on_meta(name: str) -> None:
    import torch
    import transformers

    p = PRESETS[name]
    with torch.device("meta"):
        hf = transformers.DeepseekV3ForCausalLM(_hf_config(p))
    assert param_count(p).total == _meta_count(hf)
    # The MTP module: a decoder layer shaped like the last one (MoE), eh_proj 2H -> H,
    # enorm, hnorm, shared_head.norm, plus the checkpoint's own embedding and head copies.
    h, v = p.hidden_size, p.vocab_size
    layer = _meta_count(hf.model.layers[-1])
    assert param_count(p).mtp == p.num_mtp_layers * (layer + 2 * h * h + 3 * h + 2 * v * h)
    assert sum(w.numel for w in mtp_weights(p)) == layer + 2 * h * h + 3 * h


def test_published_sizes() -> None:
    v3, kimi = param_count(PRESETS["deepseek-v3"]), param_count(PRESETS["kimi-k2"])
    # DeepSeek-V3: 671B main model + 14B MTP module = 685B on the hub, 37B activated.
    assert abs(v3.total - 671e9) / 671e9 < 0.01
    assert abs(v3.total + v3.mtp - 685e9) / 685e9 < 0.01
    assert abs(v3.mtp - 14e9) / 14e9 < 0.05
    assert round(v3.active / 1e9) == 37
    # Kimi-K2: "1T total, 32B activated" (its card), no MTP module.
    assert round(kimi.total / 1e12) == 1 and round(kimi.active / 1e9) == 32
    assert kimi.mtp == 0


def test_kv_bytes_per_token_is_the_latent() -> None:
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes x 61 layers
    for name in ("deepseek-v3", "kimi-k2"):
        assert kv_bytes_per_token(PRESETS[name], "bfloat16") == 576 * 2 * 61 == 70272


def test_published_config_json_reads_as_the_preset(tmp_path: Path) -> None:
    cfg = config_from_hf_dir(_write(tmp_path / "v3", V3_CONFIG))
    preset = PRESETS["deepseek-v3"]
    assert dataclasses.replace(cfg, name=preset.name) == preset
    kimi = dict(V3_CONFIG, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
                n_routed_experts=384, n_group=1, topk_group=1, first_k_dense_replace=1,
                vocab_size=163840, routed_scaling_factor=2.827, num_nextn_predict_layers=0,
                max_position_embeddings=131072, rope_theta=50000.0,
                rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                              "mscale": 1.0, "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096, "type": "yarn"})
    cfg = config_from_hf_dir(_write(tmp_path / "kimi", kimi))
    assert dataclasses.replace(cfg, name="kimi-k2") == PRESETS["kimi-k2"]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("topk_method", "group_limited_greedy", "topk_method: unsupported for DeepSeek-V3 "
                                            "'group_limited_greedy'; supported: noaux_tc"),
    ("scoring_func", "softmax", "scoring_func: unsupported for DeepSeek-V3 'softmax'; "
                                "supported: sigmoid"),
    ("rope_interleave", False, "rope_interleave False (RoPE on halves) is not supported; "
                               "supported: true"),
    ("moe_layer_freq", 2, "moe_layer_freq 2 is not supported"),
    ("num_nextn_predict_layers", -1, "num_nextn_predict_layers: must be an integer >= 0"),
])
def test_variants_not_implemented_are_refused(tmp_path: Path, key: str, value: Any,
                                              message: str) -> None:
    with pytest.raises(UserError) as err:
        config_from_hf_dir(_write(tmp_path, dict(V3_CONFIG, **{key: value})))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_moe_topk_method_is_checked() -> None:
    base = PRESETS["deepseek-v3"]
    with pytest.raises(ConfigError, match="moe.topk_method: unsupported expert choice 'best'; "
                                          "supported: greedy, noaux_tc"):
        base.with_overrides(moe={"topk_method": "best"})
    with pytest.raises(ConfigError, match="two best experts"):  # one expert per group
        base.with_overrides(moe={"n_group": 256, "topk_group": 8})
    with pytest.raises(ConfigError, match="num_mtp_layers must be >= 0"):
        base.with_overrides(num_mtp_layers=-1)


def test_mtp_speculation_is_priced_from_the_module() -> None:
    from infbench.core.speculative import SpeculativeConfig
    from infbench.hardware.spec import get_hardware
    from infbench.roofline.analysis import predict
    from infbench.roofline.shapes import mtp_model

    v3, hw = PRESETS["deepseek-v3"], get_hardware("h100-sxm")

    def run(cfg: ModelConfig, k: int, ratio: float = 0.0) -> Any:
        spec = SpeculativeConfig("mtp", k, acceptance=0.8, draft_cost_ratio=ratio)
        return predict(cfg, hw, batch=4, prompt_len=512, gen_len=64, speculative=spec)

    one, three = run(v3, 1).speculative, run(v3, 3).speculative
    assert one is not None and three is not None
    assert three.draft_time_s == pytest.approx(3 * one.draft_time_s)  # the module applied 3 times
    assert one.expected_tokens_per_step == pytest.approx(1 + 0.8)
    # One MoE layer + eh_proj + the head: more than a 61st of a target decode step (the
    # head and eh_proj are extra), far less than the whole step.
    decode = run(v3, 1).decode.time_s
    assert decode / 61 < one.draft_time_s < decode / 4
    # The one-layer model it prices is the MTP layer: MoE like V3's last layer.
    m = mtp_model(v3)
    assert m.num_layers == 1 and m.moe is not None and m.moe.is_moe(0)
    # An explicit draft_cost_ratio still wins.
    given = run(v3, 1, ratio=0.5).speculative
    assert given is not None and given.draft_time_s == pytest.approx(0.5 * decode)
    with pytest.raises(ConfigError, match="model 'kimi-k2' has no MTP module"):
        run(PRESETS["kimi-k2"], 1)
