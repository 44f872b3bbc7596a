"""config.json -> ModelConfig for Llama-4 (Scout, Maverick) text models (no torch).

`Llama4ForCausalLM` (model_type `llama4_text`) is read as it stands; a multimodal
`Llama4ForConditionalGeneration` config (model_type `llama4`) by its `text_config`, the
decoder infbench prices and runs (the vision tower is not part of it).  The keys map as
transformers' Llama4TextConfig defines them (docs/architectures.md#llama-4):

- `intermediate_size_mlp` is the dense layers' SwiGLU width (`ModelConfig.intermediate_size`),
  `intermediate_size` the routed experts' and the one shared expert's;
- MoE layers: `moe_layers` when listed, else every `interleave_moe_layer_step`-th layer
  (`MoEConfig.moe_step`, the others in `dense_layers` when the list is irregular); the
  router is top-k over the logits, a sigmoid of the chosen ones, and scales the expert's
  input (`MoEConfig.scale_input`);
- `no_rope_layers` (1: RoPE, 0: NoPE; default a NoPE layer every `no_rope_layer_interval`)
  -> `nope_layers`; `attention_chunk_size` chunks the RoPE layers (`attention_chunk`);
- `use_qk_norm` -> `qk_l2_norm`; `attn_temperature_tuning`, `floor_scale`, `attn_scale` ->
  `attn_temperature_floor` / `attn_temperature_scale`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from infbench.checkpoint.families import _rope_params
from infbench.core.config import AttentionConfig, ModelConfig, MoEConfig
from infbench.core.errors import ConfigError, UserError

# config.json class -> its family in the registry (= its model_type); both read into
# ModelConfig.arch "llama4" (a multimodal config by its text_config)
LLAMA4_ARCHITECTURES = {
    "Llama4ForCausalLM": "llama4_text",
    "Llama4ForConditionalGeneration": "llama4",
}
# transformers' Llama4TextConfig defaults, for keys a config.json leaves out
_DEFAULTS: dict[str, Any] = {
    "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "num_experts_per_tok": 1,
    "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
    "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
    "rope_theta": 500000.0,
}


def llama4_text(cfg_file: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's keys: `raw` itself, or a multimodal config's `text_config`."""
    archs = raw.get("architectures") or []
    if raw.get("model_type") != "llama4" and "Llama4ForConditionalGeneration" not in archs:
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise UserError(f"{cfg_file}: a llama4 (multimodal) config needs a text_config "
                        "mapping (the text model's keys)")
    return text


def _get(text: dict[str, Any], key: str) -> Any:
    value = text.get(key)
    return _DEFAULTS.get(key) if value is None else value


def _int(cfg_file: Path, text: dict[str, Any], key: str, minimum: int = 1) -> int:
    value = _get(text, key)
    if value is None:
        raise UserError(f"{cfg_file}: missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{cfg_file}: {key}: must be an integer >= {minimum} (got {value!r})")
    return value


def _layer_list(cfg_file: Path, text: dict[str, Any], key: str) -> list[int]:
    value = text.get(key)
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise UserError(f"{cfg_file}: {key}: must be a list of integers (got {value!r})")
    return value


def _moe(cfg_file: Path, text: dict[str, Any], num_layers: int) -> MoEConfig | None:
    """The MoE layers (moe_layers, else every interleave_moe_layer_step-th) and router."""
    step = _int(cfg_file, text, "interleave_moe_layer_step")
    if text.get("moe_layers") is None:
        layers = list(range(step - 1, num_layers, step))
    else:
        layers = _layer_list(cfg_file, text, "moe_layers")
        if any(not 0 <= i < num_layers for i in layers):
            raise UserError(f"{cfg_file}: moe_layers: layer indices must be in "
                            f"0..{num_layers - 1} (got {layers})")
        # The regular pattern as moe_step; any other list as the dense layers between.
        step = step if layers == list(range(step - 1, num_layers, step)) else 1
    if not layers:
        return None
    moe_step_layers = set(range(step - 1, num_layers, step))
    inter = _int(cfg_file, text, "intermediate_size")
    try:
        return MoEConfig(
            num_experts=_int(cfg_file, text, "num_local_experts"),
            num_experts_per_tok=_int(cfg_file, text, "num_experts_per_tok"),
            moe_intermediate_size=inter, num_shared_experts=1, scoring="sigmoid",
            moe_step=step, dense_layers=tuple(sorted(moe_step_layers - set(layers))),
            scale_input=True)
    except ConfigError as exc:
        raise UserError(f"{cfg_file}: {exc}") from None


def _nope_layers(cfg_file: Path, text: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """Layers without RoPE: the 0 entries of no_rope_layers (or every interval-th layer)."""
    if text.get("no_rope_layers"):
        flags = _layer_list(cfg_file, text, "no_rope_layers")
    else:  # transformers: None or [] -> a NoPE layer every no_rope_layer_interval
        every = _int(cfg_file, text, "no_rope_layer_interval")
        flags = [int((i + 1) % every != 0) for i in range(num_layers)]
    if len(flags) < num_layers or set(flags[:num_layers]) - {0, 1}:
        raise UserError(f"{cfg_file}: no_rope_layers: must list 1 (RoPE) or 0 (NoPE) for "
                        f"each of the {num_layers} layers (got {flags})")
    return tuple(i for i in range(num_layers) if flags[i] == 0)


def _check_layer_types(cfg_file: Path, text: dict[str, Any], nope: tuple[int, ...],
                       chunk: int | None, num_layers: int) -> None:
    types = text.get("layer_types")
    if types is None:
        return
    expected = ["chunked_attention" if i not in nope and chunk is not None else
                "full_attention" for i in range(num_layers)]
    if types != expected:
        raise UserError(f"{cfg_file}: layer_types {types} differs from what no_rope_layers "
                        f"and attention_chunk_size give ({expected}); not supported")


def llama4_config(cfg_file: Path, text: dict[str, Any], name: str) -> ModelConfig:
    """The ModelConfig of a Llama-4 text model (`text`: `llama4_text`'s mapping)."""
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{cfg_file}: hidden_act {act!r} unsupported for llama4; allowed: silu")
    if text.get("attention_bias"):
        raise UserError(f"{cfg_file}: attention_bias=true is not supported for llama4")
    num_layers = _int(cfg_file, text, "num_hidden_layers")
    heads = _int(cfg_file, text, "num_attention_heads")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    hidden = _int(cfg_file, text, "hidden_size")
    head_dim = _int(cfg_file, text, "head_dim")
    chunk_value = text.get("attention_chunk_size", _DEFAULTS["attention_chunk_size"])
    chunk = None if chunk_value is None else _int(cfg_file, text, "attention_chunk_size")
    nope = _nope_layers(cfg_file, text, num_layers)
    _check_layer_types(cfg_file, text, nope, chunk, num_layers)
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta, scaling = _rope_params(cfg_file, params, float(_get(text, "rope_theta")))
    scale = _get(text, "attn_scale")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(
            scale) or scale < 0:
        raise UserError(f"{cfg_file}: attn_scale: must be a finite number >= 0 (got {scale!r})")
    tuned = bool(_get(text, "attn_temperature_tuning"))
    return ModelConfig(
        name=name, vocab_size=_int(cfg_file, text, "vocab_size"), hidden_size=hidden,
        num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=None if head_dim * heads == hidden else head_dim,
        intermediate_size=_int(cfg_file, text, "intermediate_size_mlp"),
        max_seq_len=_int(cfg_file, text, "max_position_embeddings"),
        rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=float(_get(text, "rms_norm_eps")),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        attention=AttentionConfig(kind="mha" if kv_heads == heads else
                                  "mqa" if kv_heads == 1 else "gqa"),
        moe=_moe(cfg_file, text, num_layers), arch="llama4",
        attention_chunk=chunk, nope_layers=nope,
        qk_l2_norm=bool(_get(text, "use_qk_norm")) and len(nope) < num_layers,
        attn_temperature_floor=_int(cfg_file, text, "floor_scale") if tuned and nope else None,
        attn_temperature_scale=float(scale),
    )
