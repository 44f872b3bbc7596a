"""config.json -> ModelConfig for gpt-oss (`GptOssForCausalLM`, model_type `gpt_oss`; no torch).

gpt-oss-20b / 120b (docs/architectures.md): attention with biases on q, k, v and o and
one learned sink logit per head (`attention_bias`, `attention_sinks`), `layer_types`
alternating sliding (window `sliding_window`, 128) and full attention, head_dim 64,
YaRN RoPE; every layer an MoE of `num_local_experts` experts, top `num_experts_per_tok`
over the router's biased logits then a softmax over those k (`topk_softmax`), experts with
biases and the clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`), no shared expert.  Values
infbench cannot run exactly are one line naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infbench.checkpoint.families import _layer_pattern, _rope_params
from infbench.checkpoint.hf_quant import PUBLISHED_QUANTIZATION
from infbench.core.config import ModelConfig, MoEConfig
from infbench.core.errors import ConfigError, UserError

GPT_OSS_ARCHITECTURES = {"GptOssForCausalLM": "gpt_oss"}
# The released checkpoints' quantization_config: the experts in MXFP4, attention, router,
# embedding and head in bf16.  `quant.weights: native` prices a gpt-oss preset as stored
# (checkpoint/hf_quant.py reads it, as it reads a checkpoint directory's config.json).
GPT_OSS_QUANTIZATION: dict[str, Any] = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
}
PUBLISHED_QUANTIZATION.update({"gpt-oss-20b": GPT_OSS_QUANTIZATION,
                               "gpt-oss-120b": GPT_OSS_QUANTIZATION})
# transformers' GptOssConfig defaults, for keys a config.json leaves out
_DEFAULT_THETA = 150000.0
_DEFAULT_ROPE: dict[str, Any] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 4096}


def _real(cfg_file: Path, raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UserError(f"{cfg_file}: {key}: must be a finite number > 0 (got {value!r})")
    return float(value)


def gpt_oss_config(cfg_file: Path, raw: dict[str, Any], name: str) -> ModelConfig:
    """The ModelConfig of a gpt-oss config.json (`raw`, types already checked)."""
    try:
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        hidden = int(raw["hidden_size"])
        num_layers = int(raw["num_hidden_layers"])
        inter = int(raw["intermediate_size"])
        experts = int(raw.get("num_local_experts") or raw["num_experts"])
        top_k = int(raw.get("num_experts_per_tok") or raw["experts_per_token"])
    except KeyError as exc:
        raise UserError(f"{cfg_file}: missing key {exc.args[0]!r}") from None
    max_seq_len = int(raw.get("max_position_embeddings", 131072))
    head_dim = int(raw.get("head_dim") or hidden // num_heads)
    types = raw.get("layer_types") or [  # transformers' default: sliding first, alternating
        "full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(num_layers)]
    window = raw.get("sliding_window") or None
    attention = _layer_pattern(cfg_file, {**raw, "layer_types": types, "sliding_window": window},
                               "gpt_oss", num_layers, num_heads, num_kv_heads, max_seq_len)
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or dict(_DEFAULT_ROPE)
    theta, scaling = _rope_params(cfg_file, params, float(raw.get("rope_theta")
                                                          or _DEFAULT_THETA))
    try:
        moe = MoEConfig(num_experts=experts, num_experts_per_tok=top_k,
                        moe_intermediate_size=inter, scoring="topk_softmax",
                        router_bias=True, expert_bias=True, activation="clamped_swiglu",
                        swiglu_alpha=_real(cfg_file, raw, "swiglu_alpha", 1.702),
                        swiglu_limit=_real(cfg_file, raw, "swiglu_limit", 7.0))
    except ConfigError as exc:
        raise UserError(f"{cfg_file}: {exc}") from None
    return ModelConfig(
        name=name,
        vocab_size=int(raw["vocab_size"]) if "vocab_size" in raw else 201088,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim if head_dim * num_heads != hidden else None,
        intermediate_size=inter,  # no dense MLP: every layer is MoE
        max_seq_len=max_seq_len,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention=attention,
        moe=moe,
        arch="gpt_oss",
        attention_bias=bool(raw.get("attention_bias", True)),
        attention_sinks=True,
    )
