"""prefill_attention (Triton, interpreter on CPU) against its torch reference."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_test_utils import DTYPES, make_paged_kv, naive_causal_attention, tolerances

from kernels.prefill_attention import (
    prefill_attention,
    prefill_attention_cost,
    prefill_attention_ref,
)

GQA = {"mha": (2, 2), "gqa4": (8, 2), "gqa8": (8, 1)}
# (new tokens, total context) per sequence.  Equal pairs are plain prefills; a larger
# context means the earlier tokens were cached (chunked prefill or a prefix-cache hit).
BATCHES = {
    "b1-prompt": [(21, 21)],
    "b3-prompts": [(5, 5), (33, 33), (1, 1)],
    "b3-chunked": [(7, 40), (16, 16), (3, 19)],
}


def _run(pairs, heads, head_dim, dtype, window=None):
    num_heads, num_kv_heads = heads
    qlens = [n for n, _ in pairs]
    kv = make_paged_kv([c for _, c in pairs], num_kv_heads, head_dim, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(qlens), num_heads, head_dim,
                    generator=torch.Generator().manual_seed(1)).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables,
            1 / math.sqrt(head_dim))
    return q, cu, kv, prefill_attention(*args, window=window), prefill_attention_ref(
        *args, window=window)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("pairs", list(BATCHES.values()), ids=list(BATCHES))
def test_matches_ref(pairs, heads, head_dim, dtype):
    q, _, _, out, ref = _run(pairs, heads, head_dim, dtype)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **tolerances(dtype))


@pytest.mark.parametrize("window", [4, 17, 1000], ids=["w4", "w17", "w1000"])
@pytest.mark.parametrize("heads", [GQA["mha"], GQA["gqa4"]], ids=["mha", "gqa4"])
def test_sliding_window(heads, window):
    pairs = BATCHES["b3-chunked"]
    _, _, _, out, ref = _run(pairs, heads, 64, torch.float32, window=window)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))
    if window >= 40:
        _, _, _, full, _ = _run(pairs, heads, 64, torch.float32)
        torch.testing.assert_close(out, full)


@pytest.mark.parametrize("window", [None, 9], ids=["full", "w9"])
def test_varlen_batch_equals_per_sequence_loop(window):
    q, cu, kv, out, _ = _run(BATCHES["b3-chunked"], GQA["gqa4"], 64, torch.float32, window)
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        one_cu = torch.tensor([0, rows.stop - rows.start], dtype=torch.int32)
        alone = prefill_attention_ref(q[rows], kv.k_cache, kv.v_cache, one_cu,
                                      kv.context_lens[b:b + 1], kv.block_tables[b:b + 1],
                                      1 / 8, window=window)
        torch.testing.assert_close(out[rows], alone, **tolerances(torch.float32))


def test_chunked_prefill_equals_whole_prompt():
    """Two chunks (the second with the first one cached) == the whole prompt at once."""
    n, split = 37, 22
    q, _, kv, whole, _ = _run([(n, n)], GQA["gqa4"], 64, torch.float32)
    args = (kv.k_cache, kv.v_cache)
    first = prefill_attention(q[:split], *args, torch.tensor([0, split], dtype=torch.int32),
                              torch.tensor([split], dtype=torch.int32), kv.block_tables, 1 / 8)
    second = prefill_attention(q[split:], *args, torch.tensor([0, n - split], dtype=torch.int32),
                               torch.tensor([n], dtype=torch.int32), kv.block_tables, 1 / 8)
    torch.testing.assert_close(torch.cat([first, second]), whole, **tolerances(torch.float32))


def test_cost():
    cost = prefill_attention_cost(8, 2, 64, 64, [4, 10], [10, 10], dtype_bytes=2)
    assert cost.bytes == 20 * 2 * 128 * 2 + 14 * 8 * 128 * 2
    assert cost.flops == 2 * (7 + 8 + 9 + 10 + sum(range(1, 11))) * 8 * 128
    windowed = prefill_attention_cost(8, 2, 64, 64, [10], [10], 2, window=3)
    assert windowed.flops == 2 * (1 + 2 + 3 * 8) * 8 * 128
    assert cost.intensity == cost.flops / cost.bytes


@pytest.mark.parametrize("window", [None, 6], ids=["full", "w6"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_attention_sinks(dtype, window):
    """gpt-oss's sinks, chunked and whole prompts: kernel == reference == per-head loop."""
    pairs, (num_heads, num_kv_heads) = BATCHES["b3-chunked"], GQA["gqa4"]
    qlens = [n for n, _ in pairs]
    kv = make_paged_kv([c for _, c in pairs], num_kv_heads, 64, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(qlens), num_heads, 64,
                    generator=torch.Generator().manual_seed(1)).to(dtype)
    sinks = (torch.randn(num_heads, generator=torch.Generator().manual_seed(7)) * 2).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125)
    out = prefill_attention(*args, window=window, sinks=sinks)
    ref = prefill_attention_ref(*args, window=window, sinks=sinks)
    torch.testing.assert_close(out, ref, **tolerances(dtype))
    if dtype == torch.float32:
        for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
            naive = naive_causal_attention(q[start:end], kv.keys[b], kv.values[b], 0.125,
                                           window, sinks)
            torch.testing.assert_close(ref[start:end], naive, atol=1e-5, rtol=1e-5)
