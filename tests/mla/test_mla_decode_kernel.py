"""mla_decode_attention (Triton, interpreter on CPU) against its reference and against MQA."""

from __future__ import annotations

import pytest
import torch

from kernels.mla_decode_attention import (
    mla_decode_attention,
    mla_decode_attention_cost,
    mla_decode_attention_ref,
)
from kernels.paged_decode_attention import paged_decode_attention_ref

RANK, ROPE = 32, 8  # tiny-mla's kv_lora_rank and qk_rope_head_dim
BLOCK_SIZE = 4
# Context lengths: inside one block, exact multiple, crossing several blocks (block size 4).
BATCHES = {"b1": [13], "b3": [3, 8, 22]}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
TOLS = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _latent_cache(lens: list[int], dtype: torch.dtype, seed: int = 0):
    """Shuffled blocks; every slot no sequence owns holds NaN, so a stray read shows."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(needed) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    cache = torch.full((num_blocks, BLOCK_SIZE, 1, RANK + ROPE), float("nan"), dtype=dtype)
    tables = torch.zeros(len(lens), max(needed) + 1, dtype=torch.int32)  # + a padding column
    used = 0
    for b, n in enumerate(lens):
        ids = perm[used:used + needed[b]]
        used += needed[b]
        tables[b, : needed[b]] = ids.int()
        pos = torch.arange(n)
        cache[ids[pos // BLOCK_SIZE], pos % BLOCK_SIZE, 0] = torch.randn(
            n, RANK + ROPE, generator=gen).to(dtype)
    return cache, tables, torch.tensor(lens, dtype=torch.int32)


def _case(lens, dtype, num_heads=4):
    cache, tables, ctx = _latent_cache(lens, dtype)
    q = torch.randn(len(lens), num_heads, RANK + ROPE,
                    generator=torch.Generator().manual_seed(1)).to(dtype)
    return q, cache, cache[..., :RANK], tables, ctx, (RANK + ROPE) ** -0.5


@pytest.mark.parametrize("num_splits", [1, 3], ids=["nosplit", "split3"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("lens", list(BATCHES.values()), ids=list(BATCHES))
def test_kernel_matches_ref(lens, dtype, num_splits):
    q, cache, values, tables, ctx, scale = _case(lens, dtype)
    out = mla_decode_attention(q, cache, values, tables, ctx, scale, num_splits=num_splits)
    ref = mla_decode_attention_ref(q, cache, values, tables, ctx, scale)
    assert out.shape == (len(lens), 4, RANK) and out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOLS[dtype])


def test_more_heads_than_one_head_block():
    """20 heads: two programs per sequence along the heads, the second one partly masked."""
    q, cache, values, tables, ctx, scale = _case([3, 8, 22], torch.float32, num_heads=20)
    out = mla_decode_attention(q, cache, values, tables, ctx, scale, num_splits=2)
    torch.testing.assert_close(out, mla_decode_attention_ref(q, cache, values, tables, ctx, scale),
                               **TOLS[torch.float32])


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_equals_paged_decode_attention_as_mqa(dtype):
    """MLA decode is MQA with one KV head: keys = latent rows, values = their first Dl dims."""
    q, cache, values, tables, ctx, scale = _case([3, 8, 22], dtype)
    mqa = paged_decode_attention_ref(q, cache, values, tables, ctx, scale)  # (B, H, Dl)
    for split in (1, 2):
        out = mla_decode_attention(q, cache, values, tables, ctx, scale, num_splits=split)
        torch.testing.assert_close(out, mqa, **TOLS[dtype])
    torch.testing.assert_close(mla_decode_attention_ref(q, cache, values, tables, ctx, scale),
                               mqa, **TOLS[dtype])


def test_ref_matches_a_per_sequence_softmax():
    q, cache, values, tables, ctx, scale = _case([3, 8, 22], torch.float32)
    ref = mla_decode_attention_ref(q, cache, values, tables, ctx, scale)
    for b, n in enumerate(ctx.tolist()):
        pos = torch.arange(n)
        rows = cache[tables[b, pos // BLOCK_SIZE].long(), pos % BLOCK_SIZE, 0]  # (n, Dl + Dr)
        probs = torch.softmax(q[b] @ rows.T * scale, dim=-1)  # (H, n)
        torch.testing.assert_close(ref[b], probs @ rows[:, :RANK], atol=1e-5, rtol=1e-5)


def test_default_splits_and_a_values_copy_is_refused():
    q, cache, values, tables, ctx, scale = _case([13], torch.float32)
    out = mla_decode_attention(q, cache, values, tables, ctx, scale)  # default split count
    torch.testing.assert_close(out, mla_decode_attention_ref(q, cache, values, tables, ctx, scale),
                               **TOLS[torch.float32])
    with pytest.raises(AssertionError, match="view"):
        mla_decode_attention(q, cache, values.contiguous(), tables, ctx, scale)


def test_cost_counts_the_latent_once_for_all_heads():
    c = mla_decode_attention_cost(2, 128, 512, 64, [1000, 3000], 2)
    latent = 4000 * 576 * 2
    io = 2 * 128 * (512 + 64 + 512) * 2
    assert c.bytes == latent + io
    assert c.flops == 2.0 * 4000 * 128 * (576 + 512)
    # Heads do not multiply the cache traffic: only q and out grow with them.
    c64 = mla_decode_attention_cost(2, 64, 512, 64, [1000, 3000], 2)
    assert c.bytes - c64.bytes == 2 * 64 * (512 + 64 + 512) * 2
