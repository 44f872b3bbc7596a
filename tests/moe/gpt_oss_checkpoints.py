"""Tiny random gpt-oss checkpoints written by transformers (GptOssForCausalLM).

Four layers alternating sliding (window 4) and full attention, so prompts of a dozen
tokens cross the window; sinks, router and expert weights and every bias drawn wide
enough to matter, and a SwiGLU limit low enough (0.4) that the clamp cuts both the gate
and the up projection.  The YaRN RoPE of the released configs is kept (factor 32 over an
original context of 4096).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 96
WINDOW = 4
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=8,
    num_experts_per_tok=2, sliding_window=WINDOW, max_position_embeddings=256,
    swiglu_limit=0.4, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0,
    eos_token_id=1, bos_token_id=2,
)


def write_gpt_oss(tmp: Path, seed: int = 0, **cfg: Any) -> Any:
    """Save a tiny random gpt-oss model with save_pretrained; return it (eval, fp32, eager)."""
    import transformers as tf

    config = tf.GptOssConfig(**{**BASE, **cfg})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = tf.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("self_attn.sinks"):
                p.normal_(0.0, 1.5)  # some heads put much of their weight on the sink
            elif name.endswith(("mlp.router.weight", "mlp.router.bias")):
                p.normal_(0.0, 1.0)  # tokens spread over the experts, clear score gaps
            elif name.endswith("_bias") or name.endswith(".bias"):
                p.normal_(0.0, 0.2)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(tmp)
    return model
