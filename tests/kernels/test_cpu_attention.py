"""The C++ CPU paged attention (kernels/csrc/attention.cpp) against the torch references.

The caches come from `make_paged_kv`: blocks shuffled across sequences and every unused
slot NaN, so a kernel that reads past a context end or an unused block fails loudly.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernels_test_utils import make_paged_kv, tolerances

from kernels.paged_decode_attention import paged_decode_attention_cpu, paged_decode_attention_ref
from kernels.prefill_attention import prefill_attention_cpu, prefill_attention_ref

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (query heads, KV heads): MHA, SmolLM2's GQA 3, GQA 4, MQA.
GQA = {"mha": (2, 2), "gqa3": (9, 3), "gqa4": (8, 2), "mqa": (8, 1)}


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # Both sides accumulate in fp32 and round once; a bf16 result may land one ulp apart.
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else tolerances(dtype)


def _query(shape: tuple[int, ...], dtype: torch.dtype, strided: bool, seed: int = 1):
    """Random queries; strided: a view into a wider buffer (the fused qkv output)."""
    gen = torch.Generator().manual_seed(seed)
    if not strided:
        return torch.randn(shape, generator=gen).to(dtype)
    *lead, heads, dim = shape
    wide = torch.randn(*lead, heads * dim + 3 * dim, generator=gen).to(dtype)
    return wide[..., dim:dim + heads * dim].unflatten(-1, (heads, dim))


def _decode(lens, heads, head_dim, dtype, *, num_q=None, window=None, block_size=16,
            v_dim=None, strided=False):
    num_heads, num_kv_heads = heads
    kv = make_paged_kv(lens, num_kv_heads, head_dim, v_dim, block_size=block_size, dtype=dtype)
    shape = ((len(lens), num_heads, head_dim) if num_q is None
             else (len(lens), num_q, num_heads, head_dim))
    q = _query(shape, dtype, strided)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 1 / math.sqrt(head_dim))
    return q, kv, paged_decode_attention_cpu(*args, window=window), \
        paged_decode_attention_ref(*args, window=window)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("lens,block_size", [([45], 16), ([1, 17, 32, 50, 100], 16),
                                             ([3, 9, 26], 5), ([7, 64], 1)],
                         ids=["b1", "ragged", "bs5", "bs1"])
def test_decode_matches_ref(lens, block_size, heads, dtype):
    q, _, out, ref = _decode(lens, heads, 64, dtype, block_size=block_size)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()  # no NaN slot (past a context end) was read
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [1, 3, 20, 1000], ids=["w1", "w3", "w20", "w1000"])
@pytest.mark.parametrize("num_q", [None, 3], ids=["q1", "q3"])
def test_decode_window_and_multi_query(num_q, window, dtype):
    _, _, out, ref = _decode([2, 17, 50, 90], GQA["gqa4"], 64, dtype, num_q=num_q, window=window)
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("head_dim,v_dim", [(40, None), (64, 24), (72, 96)],
                         ids=["d40", "dv24", "d72dv96"])
def test_decode_head_dims_off_the_vector_width_and_strided_q(head_dim, v_dim):
    q, _, out, ref = _decode([5, 33], GQA["gqa3"], head_dim, torch.float32, num_q=2,
                             v_dim=v_dim, strided=True)
    assert not q.is_contiguous()
    assert out.shape == (2, 2, 9, v_dim or head_dim)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_decode_long_context_runs_on_all_threads_and_matches():
    """Enough work that the items spread over the thread pool (at::parallel_for)."""
    _, _, out, ref = _decode([700, 1500, 3], GQA["gqa4"], 64, torch.float32, num_q=2)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("num_q,window", [(None, None), (2, None), (None, 7), (3, 20)],
                         ids=["q1", "q2", "w7", "q3w20"])
def test_decode_whole_sequence_items_match(num_q, window, heads, threads):
    """With at least two sequences per thread an item is a whole sequence (all its KV
    heads); with fewer, one KV head of one: both give the reference's values."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for lens in ([40, 3, 77, 18, 1], [29]):  # whole-sequence items, then one-head items
            _, _, out, ref = _decode(lens, heads, 64, torch.float32, num_q=num_q,
                                     window=window, v_dim=32, strided=True)
            torch.testing.assert_close(out, ref, **tolerances(torch.float32))
    finally:
        torch.set_num_threads(before)


def test_decode_never_reads_blocks_before_the_window():
    lens, window = [70], 10
    q, kv, _, ref = _decode(lens, GQA["gqa4"], 64, torch.float32, window=window)
    for col in range((lens[0] - window) // 16):  # blocks wholly before the window
        kv.k_cache[kv.block_tables[0, col]] = float("nan")
        kv.v_cache[kv.block_tables[0, col]] = float("nan")
    out = paged_decode_attention_cpu(q, kv.k_cache, kv.v_cache, kv.block_tables,
                                     kv.context_lens, 1 / 8, window=window)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_decode_empty_context_gives_zeros():
    _, _, out, ref = _decode([0, 19], GQA["gqa4"], 64, torch.float32)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_decode_rejects_a_context_longer_than_its_table():
    _, kv, _, _ = _decode([20], GQA["mha"], 64, torch.float32)
    lens = torch.tensor([kv.block_tables.shape[1] * 16 + 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="does not fit its block table"):
        paged_decode_attention_cpu(torch.randn(1, 2, 64), kv.k_cache, kv.v_cache,
                                   kv.block_tables, lens, 0.125)


def _prefill(query_lens, context_lens, heads, head_dim, dtype, *, window=None, block_size=16,
             strided=False, v_view=None):
    """Prefill of query_lens new tokens per sequence (the last ones of each context)."""
    num_heads, num_kv_heads = heads
    kv = make_paged_kv(context_lens, num_kv_heads, head_dim, block_size=block_size, dtype=dtype)
    v_cache = kv.v_cache if v_view is None else kv.k_cache[..., :v_view]  # MLA: a strided view
    q = _query((sum(query_lens), num_heads, head_dim), dtype, strided, seed=2)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    args = (q, kv.k_cache, v_cache, cu, kv.context_lens, kv.block_tables, 1 / math.sqrt(head_dim))
    return prefill_attention_cpu(*args, window=window), prefill_attention_ref(*args, window=window)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("heads", list(GQA.values()), ids=list(GQA))
@pytest.mark.parametrize("query_lens,context_lens,block_size", [
    ([13], [13], 16),                       # a whole prompt
    ([5, 1, 33, 0, 20], [5, 10, 70, 8, 20], 16),  # cached prefixes, a decode-like row, q_len 0
    ([30, 7], [45, 7], 3),                  # block size 3
], ids=["prompt", "varlen", "bs3"])
def test_prefill_matches_ref(query_lens, context_lens, block_size, heads, dtype):
    out, ref = _prefill(query_lens, context_lens, heads, 64, dtype, block_size=block_size)
    assert out.shape == ref.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("window", [1, 4, 25], ids=["w1", "w4", "w25"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_window_strided_q(dtype, window):
    out, ref = _prefill([40, 9], [60, 9], GQA["gqa3"], 64, dtype, window=window, strided=True)
    torch.testing.assert_close(out, ref, **_tol(dtype))


def test_prefill_long_prompt_spreads_over_threads():
    out, ref = _prefill([300, 170], [300, 200], GQA["gqa4"], 64, torch.float32)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))


def test_prefill_mla_layout_values_are_a_view_of_the_keys():
    """MLA reads values as the first kv_lora_rank dims of the latent cache (a strided view)."""
    out, ref = _prefill([6, 11], [20, 11], (4, 1), 72, torch.float32, v_view=48)
    assert out.shape == (17, 4, 48)
    torch.testing.assert_close(out, ref, **tolerances(torch.float32))
