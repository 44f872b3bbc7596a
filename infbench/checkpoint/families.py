"""config.json -> ModelConfig for Qwen2/2.5, Qwen3, Gemma-2, Gemma-3 (text) and Phi-3 (no torch).

`checkpoint_config.config_from_hf_dir` hands these architectures here after the shared type
checks.  Each feature maps to a `ModelConfig` field (docs/architectures.md): Qwen2's q/k/v
biases to `qkv_bias`, the q/k norms of Qwen3 and Gemma-3 to `qk_norm`, Phi-3's
partial_rotary_factor to `rotary_dim`, Gemma's soft-capping, query_pre_attn_scalar and
Gemma-3's local RoPE base to their fields, and `layer_types` (sliding / full attention per
layer) to `AttentionConfig(kind="sliding", window, global_every)`.  What infbench cannot
run exactly is refused with one line naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infbench.core.config import AttentionConfig, ModelConfig
from infbench.core.errors import UserError

# config.json "architectures" entry -> ModelConfig.arch, for the families of this module
FAMILY_ARCHITECTURES = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
# model_type of a config saved without "architectures" -> ModelConfig.arch
FAMILY_MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3_text": "gemma3", "phi3": "phi3"}
# RoPE variants the model implements (model/layers.py ROPE_TYPES; YaRN with its attention
# factor on cos/sin, Transformer._rope_cache)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_GEMMA_SOFTCAPS = {"gemma2": (50.0, 30.0), "gemma3": (None, None)}  # transformers' defaults


def family_config(cfg_file: Path, raw: dict[str, Any], arch: str, name: str,
                  like: str | None = None, **extra: Any) -> ModelConfig:
    """The ModelConfig of a Qwen2/Qwen3/Gemma-2/Gemma-3/Phi-3 config.json (`raw`).

    `like`: the family of this module whose blocks an MoE family `arch` shares (Qwen3-MoE's
    are Qwen3's); `extra`: its MoE fields (checkpoint/moe.py)."""
    arch, model_arch = like or arch, arch
    is_gemma = arch in ("gemma2", "gemma3")
    act_key = "hidden_activation" if "hidden_activation" in raw else "hidden_act"
    act = raw.get(act_key) or ("gelu_pytorch_tanh" if is_gemma else "silu")
    allowed_act = ("gelu_pytorch_tanh",) if is_gemma else ("silu",)
    if act not in allowed_act:
        raise UserError(f"{cfg_file}: {act_key} {act!r} unsupported for {arch}; "
                        f"allowed: {', '.join(allowed_act)}")
    for key in ("mlp_bias", "attention_bias", "use_bidirectional_attention"):
        if raw.get(key):
            raise UserError(f"{cfg_file}: {key}=true is not supported for {arch}")
    try:
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        hidden = int(raw["hidden_size"])
        max_seq_len = int(raw.get("max_position_embeddings", 4096))
        fields: dict[str, Any] = dict(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_seq_len=max_seq_len,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        )
    except KeyError as exc:
        raise UserError(f"{cfg_file}: missing key {exc.args[0]!r}") from None
    head_dim = int(raw.get("head_dim") or hidden // num_heads)
    theta, scaling, local_theta, rotary = _rope(cfg_file, raw, arch, head_dim)
    attention = _layer_pattern(cfg_file, raw, arch, fields["num_layers"], num_heads,
                               num_kv_heads, max_seq_len)
    attn_cap, final_cap = _GEMMA_SOFTCAPS.get(arch, (None, None))
    if is_gemma:
        attn_cap = raw.get("attn_logit_softcapping", attn_cap)
        final_cap = raw.get("final_logit_softcapping", final_cap)
    elif raw.get("attn_logit_softcapping") or raw.get("final_logit_softcapping"):
        raise UserError(f"{cfg_file}: logit soft-capping is not part of {arch}")
    return ModelConfig(
        name=name,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim if head_dim * num_heads != hidden else None,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", is_gemma)),
        attention=attention,
        arch=model_arch,
        qkv_bias=arch == "qwen2",
        qk_norm=arch in ("qwen3", "gemma3"),
        rotary_dim=rotary,
        attn_logit_softcap=float(attn_cap) if attn_cap else None,
        final_logit_softcap=float(final_cap) if final_cap else None,
        query_pre_attn_scalar=(float(raw.get("query_pre_attn_scalar", 256)) if is_gemma
                               else None),
        rope_local_theta=local_theta,
        **fields,
        **extra,
    )


def _rope_params(cfg_file: Path, params: dict[str, Any], default_theta: float
                 ) -> tuple[float, tuple[tuple[str, Any], ...] | None]:
    """(theta, scaling items) of one RoPE parameter set (transformers 5 nests the theta)."""
    params = dict(params)
    theta = float(params.pop("rope_theta", default_theta))
    if "type" in params and "rope_type" not in params:  # the pre-4.45 spelling
        params["rope_type"] = params.pop("type")
    params.pop("partial_rotary_factor", None)
    kind = params.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise UserError(f"{cfg_file}: rope_type {kind!r} is not supported; allowed: "
                        f"{', '.join(ROPE_TYPES)}")
    if kind == "default":
        return theta, None
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))
    return theta, items


def _rope(cfg_file: Path, raw: dict[str, Any], arch: str, head_dim: int
          ) -> tuple[float, tuple[tuple[str, Any], ...] | None, float | None, int | None]:
    """(theta, scaling, Gemma-3's local theta, rotary_dim or None for the whole head)."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    default_theta = float(raw.get("rope_theta") or (1e6 if arch == "gemma3" else 10000.0))
    local_theta = None
    if arch == "gemma3":
        # transformers 5: {"full_attention": {...}, "sliding_attention": {...}}; older
        # configs: rope_theta + rope_scaling, rope_local_base_freq for the local layers.
        local = params.pop("sliding_attention", None)
        full = params.pop("full_attention", params)
        local_theta = float(raw.get("rope_local_base_freq") or 10000.0)
        if local is not None:
            local_theta, local_scaling = _rope_params(cfg_file, local, local_theta)
            if local_scaling is not None:
                raise UserError(f"{cfg_file}: rope scaling of the sliding-window layers is "
                                "not supported (Gemma-3 scales the global layers only)")
        params = dict(full)
    factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    theta, scaling = _rope_params(cfg_file, params, default_theta)
    rotary = None
    if factor != 1.0:
        if arch != "phi3":
            raise UserError(f"{cfg_file}: partial_rotary_factor != 1 is not supported for "
                            f"{arch}")
        rotary = int(head_dim * float(factor))
        if not 0 < rotary <= head_dim or rotary % 2:
            raise UserError(f"{cfg_file}: partial_rotary_factor {factor} gives {rotary} "
                            f"rotary dims of {head_dim}; allowed: an even count in 2..{head_dim}")
    return theta, scaling, local_theta, rotary


def _layer_pattern(cfg_file: Path, raw: dict[str, Any], arch: str, num_layers: int,
                   num_heads: int, num_kv_heads: int, max_seq_len: int) -> AttentionConfig:
    """Per-layer sliding / full attention as an AttentionConfig (window, global_every)."""
    window = raw.get("sliding_window")
    types = raw.get("layer_types")
    if arch in ("qwen2", "qwen3"):
        if raw.get("use_sliding_window"):
            raise UserError(f"{cfg_file}: use_sliding_window=true is not supported for {arch} "
                            "(its sliding layers start at max_window_layers); allowed: false")
        types, window = None, None
    elif arch == "phi3":  # one window on every layer, when set
        types = ["sliding_attention"] * num_layers if window else None
    elif types is None:  # a Gemma config saved before layer_types existed
        period = 2 if arch == "gemma2" else int(raw.get("sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                 for i in range(num_layers)]
    if not types or "sliding_attention" not in types or window is None:
        if num_kv_heads == num_heads:
            return AttentionConfig(kind="mha")
        return AttentionConfig(kind="mqa" if num_kv_heads == 1 else "gqa")
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UserError(f"{cfg_file}: layer_types must list sliding_attention or "
                        f"full_attention for each of the {num_layers} layers")
    # A window at least the context masks nothing, but the layer stays local (Gemma-3's
    # local RoPE base): clamp it to the context.
    window = min(int(window), max_seq_len)
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every: int | None = full[0] + 1 if full else None
    expected = ["full_attention" if every and (i + 1) % every == 0 else "sliding_attention"
                for i in range(num_layers)]
    if types != expected:
        raise UserError(f"{cfg_file}: layer_types {types} is not a repeating pattern of "
                        "sliding layers with every N-th layer full; not supported")
    return AttentionConfig(kind="sliding", window=window, global_every=every,
                           kv_heads=num_kv_heads)
