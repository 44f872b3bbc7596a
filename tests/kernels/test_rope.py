"""rope (Triton, interpreter on CPU) against its torch reference and an HF-style rotation."""

from __future__ import annotations

import pytest
import torch
from kernels_test_utils import DTYPES, tolerances

from kernels.rope import rope, rope_cost, rope_ref


def _cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # (P, rot/2)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # (P, rot_dim)


def _inputs(num_tokens, heads, head_dim, dtype, strided):
    num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(0)
    if strided:  # q and k as slices of a fused qkv output (T, (Hq + 2 Hkv) * D)
        qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
        qkv = qkv.to(dtype)
        q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
        k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim]
        k = k.view(num_tokens, num_kv_heads, head_dim)
        assert not q.is_contiguous() and not k.is_contiguous()
    else:
        q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
        k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    positions = torch.tensor([0, 5, 1, 63, 17, 2, 40][:num_tokens], dtype=torch.int64)
    return q, k, positions


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("rotary_dim", [None, 32], ids=["full", "partial32"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (3, 1)], ids=["mha", "gqa4", "q3-kv1"])
def test_matches_ref(heads, head_dim, dtype, rotary_dim, strided):
    q, k, positions = _inputs(7, heads, head_dim, dtype, strided)
    cache = _cos_sin_cache(64, rotary_dim or head_dim)
    q_ref, k_ref = q.clone(), k.clone()
    q_orig = q.clone()
    out_q, out_k = rope(q, k, positions, cache, rotary_dim)
    assert out_q is q and out_k is k  # in place
    rope_ref(q_ref, k_ref, positions, cache, rotary_dim)
    torch.testing.assert_close(q, q_ref, **tolerances(dtype))
    torch.testing.assert_close(k, k_ref, **tolerances(dtype))
    if rotary_dim is not None:  # the tail passes through untouched
        assert torch.equal(q[..., rotary_dim:], q_orig[..., rotary_dim:])
    assert torch.equal(q[0], q_orig[0])  # position 0 is the identity rotation


def test_ref_matches_hf_rotate_half():
    """HF Llama: q * cos + rotate_half(q) * sin with cos/sin = cat(freqs, freqs)."""
    q, k, positions = _inputs(5, (2, 2), 16, torch.float64, False)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    freqs = positions[:, None].double() * inv_freq  # (T, 8)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # (T, 1, 16)

    def rotate_half(x):
        return torch.cat([-x[..., 8:], x[..., :8]], dim=-1)

    expected = q * emb.cos() + rotate_half(q) * emb.sin()
    cache = torch.cat([(torch.arange(64)[:, None] * inv_freq).cos(),
                       (torch.arange(64)[:, None] * inv_freq).sin()], dim=-1)
    rope_ref(q, k, positions, cache)
    torch.testing.assert_close(q, expected)


def test_cost():
    assert rope_cost(4, 8, 2, 64, 2).flops == 3 * 4 * 10 * 64
