"""Tiny random Mixtral / Qwen2-MoE / Qwen3-MoE / DeepSeek-V2 / DeepSeek-V3 MoE checkpoints
written by transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 96
_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4,
                               max_position_embeddings=128, rms_norm_eps=1e-5,
                               tie_word_embeddings=False)


def _build(kind: str, **cfg: Any) -> Any:
    import transformers as tf

    if kind == "mixtral":
        base = dict(_COMMON, num_key_value_heads=2, intermediate_size=48, num_hidden_layers=2,
                    num_local_experts=8, num_experts_per_tok=2)
        return tf.MixtralForCausalLM(tf.MixtralConfig(**{**base, **cfg}))
    if kind == "qwen2_moe":
        base = dict(_COMMON, num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=80,
                    num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
                    qkv_bias=False)
        return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**{**base, **cfg}))
    if kind == "qwen3_moe":  # step 2: layers 1, 3, 5 MoE, but 3 is mlp_only
        base = dict(_COMMON, num_key_value_heads=2, head_dim=24, intermediate_size=96,
                    num_hidden_layers=6, moe_intermediate_size=32, num_experts=6,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                    mlp_only_layers=[3])
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**{**base, **cfg}))
    if kind == "deepseek_v2":  # DeepSeek-V2-Lite's structure: layer 0 dense, then MoE
        base = dict(_COMMON, intermediate_size=96, num_hidden_layers=3, kv_lora_rank=32,
                    q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                    first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                    moe_intermediate_size=24, n_shared_experts=2, n_group=4, topk_group=2,
                    topk_method="group_limited_greedy", routed_scaling_factor=1.5)
        return tf.DeepseekV2ForCausalLM(tf.DeepseekV2Config(**{**base, **cfg}))
    if kind == "deepseek_v3":  # V3's structure: q-LoRA, a dense layer, noaux_tc over 4 groups
        base = dict(_COMMON, intermediate_size=96, num_hidden_layers=3, kv_lora_rank=32,
                    q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                    num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=16,
                    num_experts_per_tok=4, moe_intermediate_size=24, n_shared_experts=1,
                    n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                    num_nextn_predict_layers=0)
        return tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**{**base, **cfg}))
    raise ValueError(kind)


def write_hf_moe(tmp: Path, kind: str, seed: int = 0, **cfg: Any) -> Any:
    """Save a tiny random MoE model with save_pretrained; return it (eval, fp32).

    Router weights are drawn wide (std 1) so tokens spread over the experts with clear
    score gaps; norms are random so a wrong mapping cannot hide behind all-ones.  DeepSeek-V3's
    sigmoid router gets std 0.1 (std 1 would saturate the sigmoids into ties) and a random
    e_score_correction_bias of the scores' own spread, so it changes which experts win."""
    torch.manual_seed(seed)
    model = _build(kind, **cfg).eval()
    gate_std = 0.1 if kind == "deepseek_v3" else 1.0
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                p.normal_(0.0, gate_std)
            elif p.dim() >= 2 or name.endswith(".bias"):  # Qwen2's q/k/v biases too
                p.normal_(0.0, 0.05)
    model.save_pretrained(tmp)
    return model


def write_hf_deepseek_v3_mtp(tmp: Path, seed: int = 0, **cfg: Any) -> Any:
    """A tiny DeepSeek-V3 checkpoint (num_nextn_predict_layers 1) plus its MTP module, as
    DeepSeek stores it: `model.layers.{N}.*` in a safetensors file of its own (transformers
    neither builds nor reads it).  The module's decoder layer starts from layer N-1's
    tensors plus noise, its norms and eh_proj are random; `embed_tokens` and
    `shared_head.head` are the checkpoint's copies of the main model's.  Returns the
    transformers model of the main layers."""
    from safetensors.torch import load_file, save_file

    hf = write_hf_moe(tmp, "deepseek_v3", seed=seed, num_nextn_predict_layers=1, **cfg)
    n = hf.config.num_hidden_layers
    h = hf.config.hidden_size
    gen = torch.Generator().manual_seed(seed + 100)
    main = load_file(str(tmp / "model.safetensors"))
    last = f"model.layers.{n - 1}."
    mtp = {f"model.layers.{n}." + k.removeprefix(last):
           v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in main.items()
           if k.startswith(last)}
    for name in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"model.layers.{n}.{name}.weight"] = 0.5 + torch.rand(h, generator=gen)
    mtp[f"model.layers.{n}.eh_proj.weight"] = 0.1 * torch.randn(h, 2 * h, generator=gen)
    mtp[f"model.layers.{n}.embed_tokens.weight"] = main["model.embed_tokens.weight"].clone()
    mtp[f"model.layers.{n}.shared_head.head.weight"] = main["lm_head.weight"].clone()
    save_file({k: v.contiguous() for k, v in mtp.items()}, str(tmp / "mtp.safetensors"))
    return hf
