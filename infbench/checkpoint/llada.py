"""LLaDA's config.json (model_type "llada", OLMo-style keys) -> ModelConfig + mask token id.

No torch: `infbench predict` prices a LLaDA directory from this alone; the weights are read
by `model/diffusion.load_llada`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infbench.core.config import ModelConfig
from infbench.core.errors import UserError


def is_llada_dir(path: str | Path) -> bool:
    """Whether `path` is a directory whose config.json says model_type "llada"."""
    file = Path(path) / "config.json"
    try:
        return bool(json.loads(file.read_text(encoding="utf-8")).get("model_type") == "llada")
    except (OSError, ValueError, AttributeError):
        return False


def read_llada_config(path: str | Path) -> tuple[ModelConfig, int | None]:
    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise UserError(f"{root}: no config.json")
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{config_file}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{config_file}: expected a JSON object")
    return llada_config(data, str(root))


def llada_config(data: dict[str, Any], origin: str) -> tuple[ModelConfig, int | None]:
    """LLaDA config.json -> (ModelConfig, mask_token_id)."""
    if data.get("model_type") != "llada":
        raise UserError(f"{origin}: model_type is {data.get('model_type')!r}, expected 'llada'")
    unsupported = {k: data[k] for k in ("include_bias", "include_qkv_bias", "alibi",
                                        "attention_layer_norm", "input_emb_norm",
                                        "scale_logits") if data.get(k)}
    if data.get("rope", True) is not True:
        unsupported["rope"] = data["rope"]
    if data.get("block_type", "llama") != "llama":
        unsupported["block_type"] = data["block_type"]
    # LLaDALlamaBlock: act(ff_proj(x)) * up_proj(x); "silu" is that SwiGLU, while "swiglu"
    # would split ff_proj's output in two and is not mapped here.
    if data.get("activation_type", "silu") != "silu":
        unsupported["activation_type"] = data["activation_type"]
    if unsupported:
        raise UserError(f"{origin}: unsupported LLaDA options {unsupported} (llama blocks "
                        "with RoPE, SiLU gating and no biases only)")
    try:
        heads = int(data["n_heads"])
        config = ModelConfig(
            name=str(data.get("name_or_path") or Path(origin).name or "llada"),
            vocab_size=int(data.get("embedding_size") or data["vocab_size"]),
            hidden_size=int(data["d_model"]),
            num_layers=int(data["n_layers"]),
            num_heads=heads,
            num_kv_heads=int(data.get("n_kv_heads") or heads),
            intermediate_size=int(data["mlp_hidden_size"]),
            max_seq_len=int(data.get("max_sequence_length", 4096)),
            rope_theta=float(data.get("rope_theta", 10000.0)),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(data.get("weight_tying", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{origin}: config.json is missing or has a bad value ({exc})") from None
    mask = data.get("mask_token_id")
    return config, (None if mask is None else int(mask))
