"""Checkpoint writers for the model tests: tiny checkpoints written by transformers and by gguf-py.

Nothing is downloaded: every checkpoint here is a random tiny model saved to tmp_path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


def write_hf_llama(tmp: Path, arch: str = "llama", seed: int = 0, **cfg: Any) -> Any:
    """Save a tiny random Llama/Mistral with save_pretrained; return the HF model (eval, fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    base: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    base.update(cfg)
    config_cls, model_cls = (
        (MistralConfig, MistralForCausalLM)
        if arch == "mistral"
        else (LlamaConfig, LlamaForCausalLM)
    )
    torch.manual_seed(seed)
    model = model_cls(config_cls(**base)).eval()
    # Random norm weights so a wrong norm mapping cannot hide behind all-ones.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp)
    return model


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k row permutation: each head's halves become interleaved pairs."""
    rows = weight.shape[0]
    w = weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def write_gguf_from_hf(model: Any, path: Path, dtype: Any = np.float32) -> None:
    """Write a HF Llama as a llama.cpp-style GGUF (llama.* metadata, blk.N names, permuted q/k)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    names = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, t in model.state_dict().items():
        arr = t.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            parts = name.split(
                "."
            )  # model.layers.N.(self_attn|mlp).X.weight | model.layers.N.X.weight
            leaf = parts[-2]
            out = f"blk.{parts[2]}.{names[leaf]}.weight"
            if leaf == "q_proj":
                arr = llama_cpp_permute(arr, c.num_attention_heads)
            elif leaf == "k_proj":
                arr = llama_cpp_permute(arr, c.num_key_value_heads)
        # llama.cpp keeps 1-D norms in F32 whatever the file type.
        w.add_tensor(out, arr if arr.ndim == 1 else arr.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
