"""MoE logits equal transformers' Mixtral, Qwen2-MoE and DeepSeek-V2 on tiny random models."""

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


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "deepseek_v2"])
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
    if kind == "deepseek_v2":  # first_k_dense_replace=1: a dense layer, then MoE layers
        assert type(mlps[0]) is SwiGLUMLP and all(isinstance(m, MoEMLP) for m in mlps[1:])
    else:
        assert all(isinstance(m, MoEMLP) for m in mlps)
    # The tokens really spread: more than the top-k experts got tokens in every MoE layer.
    moe = loaded.config.moe
    assert moe is not None
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
