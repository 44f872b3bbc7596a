"""Tiny random DeepSeek-V2 checkpoints written by transformers (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 96


def write_hf_deepseek_v2(tmp: Path, seed: int = 0, **cfg: Any) -> Any:
    """Save a tiny dense DeepseekV2ForCausalLM with save_pretrained; return it (eval, fp32)."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    base: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        first_k_dense_replace=2,  # every layer dense: the engine has no MoE layers yet
        max_position_embeddings=128,
        rms_norm_eps=1e-5,  # differs from the latent norms' fixed 1e-6, so a mix-up shows
        tie_word_embeddings=False,
    )
    base.update(cfg)
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(DeepseekV2Config(**base)).eval()
    # Random norm weights so a wrong norm mapping cannot hide behind all-ones.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp)
    return model
