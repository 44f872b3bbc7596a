"""Write a loaded Llama/Mistral model as a Hugging Face checkpoint directory.

The inverse of `loader._load_safetensors` for the architectures `config_from_hf_dir`
reads back as they were: config.json in transformers' Llama (or Mistral) format,
`model.safetensors` with the unfused HF tensor names (our fused `qkv_proj` split into
q/k/v, `gate_up_proj` into gate/up), and the tokenizer as `tokenizer.json` +
`tokenizer_config.json`.  `infbench prune` writes pruned models this way, so `model:
{path: DIR}` runs them and transformers loads them.

The directory appears whole or not at all (`core.io.atomic_directory`): everything is
written into a temporary directory beside the target, fsynced, then renamed into place; a
killed write's temporary is removed by the next write into the same target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from infbench.core.config import ModelConfig
from infbench.core.errors import ConfigError
from infbench.core.io import atomic_directory
from infbench.model.layers import SwiGLUMLP
from infbench.model.quant import QuantLinear
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import Attention, DecoderLayer, Transformer

if TYPE_CHECKING:
    from infbench.model.loader import LoadedModel

WRITABLE_ATTENTION = ("mha", "gqa", "mqa", "sliding")
_ARCH_CLASSES = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM",
                                                                     "mistral")}
_LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def check_writable(cfg: ModelConfig) -> None:
    """Refuse, before any work, a model this writer cannot express as a Llama checkpoint."""
    a = cfg.attention
    if (cfg.arch not in _ARCH_CLASSES or cfg.moe is not None or a.kind not in WRITABLE_ATTENTION
            or a.global_every is not None):
        raise ConfigError(
            f"model {cfg.name!r} (arch {cfg.arch}, attention.kind {a.kind}) cannot be written as "
            "a Hugging Face checkpoint; allowed: Llama/Mistral models with mha, gqa, mqa or "
            "sliding attention without global layers")


def hf_config(cfg: ModelConfig, tokenizer: Tokenizer | None, dtype: str) -> dict[str, Any]:
    """config.json of `cfg` in transformers' format (read back by `config_from_hf_dir`)."""
    check_writable(cfg)
    arch = "mistral" if cfg.attention.kind == "sliding" else cfg.arch
    class_name, model_type = _ARCH_CLASSES[arch]
    out: dict[str, Any] = {
        "architectures": [class_name],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.dim_head,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling_dict,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
    }
    if arch == "mistral":
        out["sliding_window"] = cfg.attention.window
    if tokenizer is not None:
        out["bos_token_id"] = tokenizer.bos_token_id
        out["eos_token_id"] = tokenizer.eos_token_id
    return out


def _weight(module: nn.Module) -> torch.Tensor:
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise ConfigError(f"cannot write a {type(module).__name__} as a float weight")
    return module.weight


def hf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Every weight under its Hugging Face name, contiguous CPU copies (fused ones split)."""
    if any(isinstance(m, QuantLinear) for m in model.modules()):
        raise ConfigError("a quantized model cannot be written as a float checkpoint")
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _weight(model.embed_tokens),
                                    "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        out["lm_head.weight"] = _weight(model.lm_head)
    for i, block in enumerate(model.layers):
        layer = cast(DecoderLayer, block)
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(attn, Attention) or not isinstance(mlp, SwiGLUMLP):
            raise ConfigError(f"layer {i}: only softmax attention + MLP blocks can be written")
        q, k, v = _weight(attn.qkv_proj).split(attn.split_sizes, dim=0)
        out[prefix + "self_attn.q_proj.weight"] = q
        out[prefix + "self_attn.k_proj.weight"] = k
        out[prefix + "self_attn.v_proj.weight"] = v
        out[prefix + "self_attn.o_proj.weight"] = _weight(attn.o_proj)
        gate, up = _weight(mlp.gate_up_proj).split(mlp.intermediate_size, dim=0)
        out[prefix + "mlp.gate_proj.weight"] = gate
        out[prefix + "mlp.up_proj.weight"] = up
        out[prefix + "mlp.down_proj.weight"] = _weight(mlp.down_proj)
        for norm in _LAYER_NORMS:
            out[prefix + norm] = layer.get_parameter(norm)
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in out.items()}


def _write_tokenizer(tokenizer: Tokenizer, root: Path, max_len: int) -> None:
    tokenizer.backend.save(str(root / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": max_len}
    for key in ("bos_token", "eos_token"):
        if getattr(tokenizer, key):
            config[key] = getattr(tokenizer, key)
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                encoding="utf-8")


def save_checkpoint(loaded: LoadedModel, out: str | os.PathLike[str], *,
                    overwrite: bool = False) -> Path:
    """Write `loaded` to the directory `out` (see the module docstring); returns its path."""
    from safetensors.torch import save_file

    target = Path(out)
    dtype = {torch.float32: "float32", torch.float16: "float16",
             torch.bfloat16: "bfloat16"}[loaded.model.dtype]
    config = hf_config(loaded.config, loaded.tokenizer, dtype)
    tensors = hf_tensors(loaded.model)
    with atomic_directory(target, overwrite=overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if loaded.tokenizer is not None:
            _write_tokenizer(loaded.tokenizer, tmp, loaded.config.max_seq_len)
        for file in tmp.iterdir():
            os.chmod(file, 0o644)  # safetensors writes 0600
    return target
