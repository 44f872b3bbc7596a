"""Transformer pieces without a reference checkpoint: presets, CLA, RoPE layout, dtypes."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from infbench.core.config import LayerSpec
from infbench.model.context import DenseContext, causal_window_mask
from infbench.model.layers import apply_rope, build_rope_cache
from infbench.model.loader import load_model


def _logits(model: torch.nn.Module, ids: torch.Tensor, cu: list[int]) -> torch.Tensor:
    pos = torch.cat([torch.arange(b - a) for a, b in pairwise(cu)])
    with torch.no_grad():
        return model.compute_logits(model(ids, pos, DenseContext(cu)))


def test_preset_is_seeded_and_in_dtype() -> None:
    a, b = load_model({"preset": "tiny"}, seed=3), load_model({"preset": "tiny"}, seed=3)
    c = load_model({"preset": "tiny"}, seed=4)
    wa = a.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(wa, b.model.layers[0].self_attn.qkv_proj.weight)
    assert not torch.equal(wa, c.model.layers[0].self_attn.qkv_proj.weight)
    assert 0.015 < wa.std().item() < 0.025
    assert torch.equal(a.model.norm.weight, torch.ones(64))
    half = load_model({"preset": "tiny"}, dtype="bfloat16", seed=3)
    assert all(p.dtype == torch.bfloat16 for p in half.model.parameters())
    assert half.weight_bytes * 2 == a.weight_bytes and a.tokenizer is None
    assert a.source.startswith("preset tiny")


def test_cla_layer_reads_owner_kv() -> None:
    loaded = load_model(
        {"preset": "tiny"}, overrides={"attention": {"kind": "cla", "cla_group": 2}}
    )
    owner, reader = loaded.model.layers
    hq, hkv, d = 4, 2, 16
    assert owner.self_attn.qkv_proj.weight.shape == ((hq + 2 * hkv) * d, 64)
    assert reader.self_attn.qkv_proj.weight.shape == (hq * d, 64)  # no k/v projection
    ids = torch.randint(0, 256, (14,), generator=torch.Generator().manual_seed(0))
    packed = _logits(loaded.model, ids, [0, 6, 14])
    torch.testing.assert_close(packed[6:], _logits(loaded.model, ids[6:], [0, 8]))


def test_rope_cache_layout_and_rotation() -> None:
    cache = build_rope_cache(10, 8, 10000.0, None, torch.float32, "cpu")  # (10, 8)
    assert cache.shape == (10, 8)
    torch.testing.assert_close(cache[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)
    torch.testing.assert_close(cache[3, :4], torch.cos(3 * inv))
    torch.testing.assert_close(cache[3, 4:], torch.sin(3 * inv))
    # Rotate-half pairs dim i with dim i + D/2: a unit vector on dim 0 turns into dim 4.
    q = torch.zeros(1, 1, 8)
    q[0, 0, 0] = 1.0
    out, none = apply_rope(q, None, torch.tensor([3]), cache)
    assert none is None
    torch.testing.assert_close(out[0, 0, 0], torch.cos(3 * inv[0]))
    torch.testing.assert_close(out[0, 0, 4], torch.sin(3 * inv[0]))
    # Rotation preserves norms and relative positions: <R(p)q, R(p)k> is independent of p.
    g = torch.Generator().manual_seed(0)
    qv, kv = torch.randn(1, 1, 8, generator=g), torch.randn(1, 1, 8, generator=g)
    dots = []
    for p in (0, 4, 9):
        rq, rk = apply_rope(qv, kv, torch.tensor([p]), cache)
        dots.append((rq * rk).sum())
    torch.testing.assert_close(torch.stack(dots), dots[0].expand(3))


@pytest.mark.parametrize("window", [1, 3, None])
def test_window_mask_semantics(window: int | None) -> None:
    mask = causal_window_mask(6, window, torch.device("cpu"))
    for t in range(6):
        for p in range(6):
            expected = p <= t and (window is None or t - p < window)
            assert bool(mask[t, p]) == expected


def test_dense_context_window_one_attends_to_self_only() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 2, 4, generator=g) for _ in range(3))
    out = DenseContext.single(5).attention(LayerSpec(0, "attention", window=1), q, k, v, 0.5)
    torch.testing.assert_close(out, v)
