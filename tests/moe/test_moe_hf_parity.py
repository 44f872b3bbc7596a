"""MoE logits equal transformers' Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V2 on tiny random
models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from moe_checkpoints import VOCAB, write_hf_moe

from infbench.checkpoint.metadata import config_from_hf_dir
from infbench.model.context import DenseContext
from infbench.model.layers import SwiGLUMLP
from infbench.model.loader import load_model
from infbench.model.moe import MoEMLP
from infbench.roofline.shapes import weight_bytes

TOL = 2e-5
SEQ_LEN = 23


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.numel()), DenseContext([0, ids.numel()]))
        return model.compute_logits(hidden)  # (T, V)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2"])
def test_logits_match_transformers(tmp_path: Path, kind: str) -> None:
    hf = write_hf_moe(tmp_path, kind)
    loaded = load_model({"path": str(tmp_path)})
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    out = _logits(loaded.model, ids)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)
    # What the checkpoint filled is what the cost model prices (Qwen2-MoE's gate included).
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32")
    mlps = [layer.mlp for layer in loaded.model.layers]
    moe = loaded.config.moe
    assert moe is not None
    # DeepSeek-V2: first_k_dense_replace=1, a dense layer then MoE layers; Qwen3-MoE:
    # decoder_sparse_step 2 and mlp_only_layers [3], MoE on layers 1 and 5 only.
    expected = {"deepseek_v2": [1, 2], "qwen3_moe": [1, 5]}.get(kind, list(range(len(mlps))))
    assert [i for i, m in enumerate(mlps) if isinstance(m, MoEMLP)] == expected
    assert all(type(m) is SwiGLUMLP for m in mlps if not isinstance(m, MoEMLP))
    assert [moe.is_moe(i) for i in range(len(mlps))] == [i in expected for i in
                                                         range(len(mlps))]
    # The tokens really spread: more than the top-k experts got tokens in every MoE layer.
    for m in mlps:
        if isinstance(m, MoEMLP):
            assert m.expert_counts is not None
            assert int((m.expert_counts > 0).sum()) > moe.num_experts_per_tok
            assert int(m.expert_counts.sum()) == SEQ_LEN * moe.num_experts_per_tok


def test_router_options_are_read(tmp_path: Path) -> None:
    for kind, expect in [
        ("mixtral", dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                         num_shared_experts=0, n_group=1, first_k_dense=0)),
        ("qwen2_moe", dict(num_experts=6, shared_intermediate_size=80, shared_gate=True,
                           norm_topk_prob=False, moe_intermediate_size=32)),
        ("qwen3_moe", dict(num_experts=6, num_experts_per_tok=2, num_shared_experts=0,
                           norm_topk_prob=True, moe_step=2, dense_layers=(3,),
                           scoring="softmax", moe_intermediate_size=32)),
        ("deepseek_v2", dict(num_experts=8, num_experts_per_tok=3, num_shared_experts=2,
                             n_group=4, topk_group=2, routed_scaling_factor=1.5,
                             first_k_dense=1, scoring="softmax")),
    ]:
        d = tmp_path / kind
        write_hf_moe(d, kind)
        moe = config_from_hf_dir(d).moe
        assert moe is not None
        assert {k: getattr(moe, k) for k in expect} == expect, kind


def test_renormalized_biased_qwen2_moe_and_greedy_deepseek_match(tmp_path: Path) -> None:
    # qkv_bias=True: the released Qwen2-MoE checkpoints' q/k/v biases
    for kind, cfg in [("qwen2_moe", dict(norm_topk_prob=True, qkv_bias=True)),
                      ("deepseek_v2", dict(topk_method="greedy", routed_scaling_factor=1.0))]:
        d = tmp_path / kind
        hf = write_hf_moe(d, kind, seed=3, **cfg)
        ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            ref = hf(ids[None]).logits[0].float()
        out = _logits(load_model({"path": str(d)}).model, ids)
        torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)


def test_qwen3_moe_attention_is_qwen3s(tmp_path: Path) -> None:
    write_hf_moe(tmp_path, "qwen3_moe")
    cfg = config_from_hf_dir(tmp_path)
    assert (cfg.arch, cfg.qk_norm, cfg.qkv_bias, cfg.head_dim) == ("qwen3_moe", True, False, 24)
    assert cfg.intermediate_size == 96  # the dense layers' width


@pytest.mark.parametrize("kind, cfg", [
    ("qwen3_moe", dict(norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[0, 4])),
    # Qwen2-MoE's dense layers among its MoE layers, which the reader used to refuse
    ("qwen2_moe", dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[1],
                       norm_topk_prob=True)),
])
def test_dense_layers_among_qwen_moe_layers_match(tmp_path: Path, kind: str, cfg: dict) -> None:
    hf = write_hf_moe(tmp_path, kind, seed=4, **cfg)
    loaded = load_model({"path": str(tmp_path)})
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(_logits(loaded.model, ids), ref, atol=TOL, rtol=TOL)
    hf_moe = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in hf.model.layers]
    ours = [isinstance(layer.mlp, MoEMLP) for layer in loaded.model.layers]
    assert ours == hf_moe and any(ours) and not all(ours)
    assert loaded.weight_bytes == weight_bytes(loaded.config, "float32")


def test_qwen3_moe_kv_bytes_equal_transformers_cache(tmp_path: Path) -> None:
    from infbench.roofline.shapes import kv_bytes_per_token

    hf = write_hf_moe(tmp_path, "qwen3_moe")
    ids = torch.arange(SEQ_LEN)[None] % VOCAB
    with torch.no_grad():
        cache = hf(ids, use_cache=True).past_key_values
    stored = sum(t.numel() * t.element_size() for layer in cache.layers
                 for t in (layer.keys, layer.values))
    assert stored % SEQ_LEN == 0
    assert kv_bytes_per_token(config_from_hf_dir(tmp_path), "float32") == stored // SEQ_LEN
