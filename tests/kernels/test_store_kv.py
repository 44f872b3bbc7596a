"""store_kv (Triton, interpreter on CPU) against its torch reference."""

from __future__ import annotations

import pytest
import torch
from kernels_test_utils import DTYPES

from kernels.store_kv import store_kv, store_kv_cost, store_kv_ref

SHAPES = {"h1-d64": (1, 64, 64), "h2-d128": (2, 128, 128), "h3-d64-dv32": (3, 64, 32)}


def _inputs(num_kv_heads, head_dim, v_head_dim, dtype, fused):
    gen = torch.Generator().manual_seed(0)
    num_tokens, num_blocks, block_size = 7, 5, 4
    if fused:  # key/value as strided views of one fused projection output
        fused_kv = torch.randn(num_tokens, num_kv_heads, head_dim + v_head_dim, generator=gen)
        fused_kv = fused_kv.to(dtype)
        key, value = fused_kv[..., :head_dim], fused_kv[..., head_dim:]
    else:
        key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
        value = torch.randn(num_tokens, num_kv_heads, v_head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, v_head_dim, generator=gen)
    # Scattered slots across blocks, two padding tokens (-1).
    slots = torch.tensor([13, 2, -1, 19, 4, -1, 8], dtype=torch.int64)
    return key, value, k_cache, v_cache.to(dtype), slots


@pytest.mark.parametrize("fused", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_matches_ref(shape, dtype, fused):
    key, value, k_cache, v_cache, slots = _inputs(*shape, dtype, fused)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(key, value, k_cache, v_cache, slots)
    store_kv_ref(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_ref_writes_exactly_the_valid_slots():
    key, value, k_cache, v_cache, slots = _inputs(2, 64, 64, torch.float32, False)
    before = k_cache.clone()
    store_kv_ref(key, value, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, 2, 64)
    flat_v = v_cache.view(-1, 2, 64)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], key[t]) and torch.equal(flat_v[slot], value[t])
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(flat_k[untouched], before.view(-1, 2, 64)[untouched])


def test_cost():
    cost = store_kv_cost(10, 2, 64, 32, dtype_bytes=2)
    assert cost.bytes == 2 * 10 * 2 * 96 * 2 + 80 and cost.flops == 0
