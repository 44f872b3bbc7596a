"""paged_decode_attention (Triton, interpreter on CPU) against its torch reference."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_test_utils import DTYPES, make_paged_kv, naive_causal_attention, tolerances

from kernels.paged_decode_attention import (
    default_num_splits,
    paged_decode_attention,
    paged_decode_attention_cost,
    paged_decode_attention_ref,
)
from kernels.prefill_attention import prefill_attention

# (query heads, KV heads) for GQA ratios 1, 4 and 8.
GQA = {"mha": (2, 2), "gqa4": (8, 2), "gqa8": (8, 1)}
# Context lengths (block size 16): inside one block, crossing blocks, an exact multiple.
BATCHES = {"b1": [45], "b4": [1, 17, 32, 50]}


def _run(lens, heads, head_dim, dtype, num_q=None, window=None, num_splits=None, v_dim=None):
    num_heads, num_kv_heads = heads
    kv = make_paged_kv(lens, num_kv_heads, head_dim, v_dim, dtype=dtype)
    shape = (len(lens), num_heads, head_dim) if num_q is None else (len(lens), num_q, num_heads,
                                                                     head_dim)
    q = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 1 / math.sqrt(head_dim))
    out = paged_decode_attention(*args, window=window, num_splits=num_splits)
    ref = paged_decode_attention_ref(*args, window=window)
    return q, kv, out, ref


@pytest.mark.parametrize("num_splits", [1, 3], ids=["nosplit", "split3"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("lens", list(BATCHES.values()), ids=list(BATCHES))
def test_matches_ref(lens, heads, head_dim, dtype, num_splits):
    q, _, out, ref = _run(lens, heads, head_dim, dtype, num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **tolerances(dtype))


@pytest.mark.parametrize("num_splits", [1, 4], ids=["nosplit", "split4"])
@pytest.mark.parametrize("window", [3, 20, 1000], ids=["w3", "w20", "w1000"])
def test_sliding_window(window, num_splits):
    _, _, out, ref = _run([1, 17, 50], GQA["gqa4"], 64, torch.float32, window=window,
                          num_splits=num_splits)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))
    if window >= 50:  # a window longer than every context changes nothing
        _, _, full, _ = _run([1, 17, 50], GQA["gqa4"], 64, torch.float32, num_splits=num_splits)
        torch.testing.assert_close(out, full)


def test_window_never_reads_blocks_outside_it():
    """Poison every block that lies fully before the window: the result must stay finite."""
    lens, window = [70], 10
    q, kv, out, ref = _run(lens, GQA["gqa4"], 64, torch.float32, window=window, num_splits=2)
    first_needed_block = (lens[0] - window) // 16
    for col in range(first_needed_block):
        kv.k_cache[kv.block_tables[0, col]] = float("nan")
        kv.v_cache[kv.block_tables[0, col]] = float("nan")
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    poisoned = paged_decode_attention(*args, window=window, num_splits=2)
    torch.testing.assert_close(poisoned, ref, **tolerances(torch.float32))


@pytest.mark.parametrize("num_splits", [1, 2], ids=["nosplit", "split2"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("window", [None, 6], ids=["full", "w6"])
def test_multi_query_equals_prefill(window, dtype, num_splits):
    """Q=3 speculative tokens per sequence == prefill_attention over the same new tokens."""
    lens, num_q = [3, 20, 33], 3
    q, kv, out, ref = _run(lens, GQA["gqa4"], 64, dtype, num_q=num_q, window=window,
                           num_splits=num_splits)
    torch.testing.assert_close(out, ref, **tolerances(dtype))
    cu = torch.arange(0, num_q * (len(lens) + 1), num_q, dtype=torch.int32)  # (B+1,)
    flat = q.reshape(-1, *q.shape[2:])  # (B*Q, Hq, D)
    pre = prefill_attention(flat, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables,
                            1 / math.sqrt(64), window=window)
    torch.testing.assert_close(out.reshape(pre.shape), pre, **tolerances(dtype))


@pytest.mark.parametrize("num_splits", [1, 3], ids=["nosplit", "split3"])
def test_varlen_batch_equals_per_sequence_loop(num_splits):
    lens = [5, 16, 47, 2]
    q, kv, out, _ = _run(lens, GQA["gqa8"], 64, torch.float32, num_splits=num_splits)
    for b in range(len(lens)):
        alone = paged_decode_attention_ref(q[b:b + 1], kv.k_cache, kv.v_cache,
                                           kv.block_tables[b:b + 1], kv.context_lens[b:b + 1],
                                           1 / 8)
        torch.testing.assert_close(out[b:b + 1], alone, **tolerances(torch.float32))


def test_value_head_dim_differs_from_key_head_dim():
    _, _, out, ref = _run([9, 40], GQA["gqa4"], 64, torch.float32, num_splits=2, v_dim=32)
    assert out.shape == (2, 8, 32)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_empty_context_rows_are_zero():
    """A sequence with context 0 (batch padding) yields zeros, not NaN, in both paths."""
    _, _, out, ref = _run([0, 19], GQA["gqa4"], 64, torch.float32, num_splits=2)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(ref[0], out[0])
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_default_num_splits_heuristic_and_result():
    cpu = torch.device("cpu")
    assert default_num_splits(1, 1, 16384, cpu) > 1  # long context, tiny batch: split
    assert default_num_splits(256, 8, 16384, cpu) == 1  # plenty of programs already
    assert default_num_splits(1, 1, 100, cpu) == 1  # too short to be worth merging
    _, _, out, ref = _run([300], GQA["gqa8"], 64, torch.float32)  # num_splits=None
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_cost():
    cost = paged_decode_attention_cost(2, 8, 2, 64, 64, [100, 300], dtype_bytes=2)
    kv_bytes = (100 + 300) * 2 * (64 + 64) * 2
    io_bytes = 2 * 8 * (64 + 64) * 2
    assert cost.bytes == kv_bytes + io_bytes
    assert cost.flops == 2 * (100 + 300) * 8 * (64 + 64)
    windowed = paged_decode_attention_cost(2, 8, 2, 64, 64, [100, 300], 2, window=50)
    assert windowed.bytes == 2 * 50 * 2 * 128 * 2 + io_bytes
    multi = paged_decode_attention_cost(1, 8, 2, 64, 64, 10, 2, num_query_tokens=3)
    assert multi.flops == 2 * (8 + 9 + 10) * 8 * 128


def _sinks(num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Sink logits on the scale of the scores (some above, some below), one per query head."""
    return (torch.randn(num_heads, generator=torch.Generator().manual_seed(7)) * 2).to(dtype)


@pytest.mark.parametrize("num_q", [None, 3], ids=["q1", "q3"])
@pytest.mark.parametrize("window", [None, 5], ids=["full", "w5"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["nosplit", "split3"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_attention_sinks(dtype, num_splits, window, num_q):
    """gpt-oss's sinks: kernel == reference == a per-head loop with the sink column."""
    lens, heads = [1, 17, 50], GQA["gqa4"]
    kv = make_paged_kv(lens, heads[1], 64, dtype=dtype)
    q_shape = (3, heads[0], 64) if num_q is None else (3, num_q, heads[0], 64)
    q = torch.randn(q_shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    sinks = _sinks(heads[0], dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    out = paged_decode_attention(*args, window=window, num_splits=num_splits, sinks=sinks)
    ref = paged_decode_attention_ref(*args, window=window, sinks=sinks)
    torch.testing.assert_close(out, ref, **tolerances(dtype))
    if dtype == torch.float32:
        q4 = q if num_q else q[:, None]
        for b in range(3):
            naive = naive_causal_attention(q4[b], kv.keys[b], kv.values[b], 0.125, window,
                                           sinks)
            torch.testing.assert_close(ref[b] if num_q else ref[b][None], naive,
                                       atol=1e-5, rtol=1e-5)
        plain = paged_decode_attention_ref(*args, window=window)
        assert not torch.allclose(plain, ref, atol=1e-3)  # the sinks change the result
