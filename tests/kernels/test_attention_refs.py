"""The attention references themselves against a naive dense causal attention.

The K/V of each sequence are built contiguously, scattered into a shuffled paged cache,
and both references must reproduce a per-head torch.softmax over an explicit mask.
"""

from __future__ import annotations

import pytest
import torch
from kernels_test_utils import make_paged_kv, naive_causal_attention

from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.prefill_attention import prefill_attention_ref

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("window", [None, 5], ids=["full", "w5"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
def test_refs_match_naive_dense_attention(heads, window):
    num_heads, num_kv_heads = heads
    lens, num_q, scale = [3, 18, 35], 3, 0.2
    kv = make_paged_kv(lens, num_kv_heads, 16, v_head_dim=8)
    gen = torch.Generator().manual_seed(3)

    q = torch.randn(len(lens), num_q, num_heads, 16, generator=gen)
    decode = paged_decode_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables,
                                        kv.context_lens, scale, window=window)
    single = paged_decode_attention_ref(q[:, -1], kv.k_cache, kv.v_cache, kv.block_tables,
                                        kv.context_lens, scale, window=window)
    qlens = [2, 18, 10]  # a partial chunk, a full prompt, a chunk after cached context
    flat = torch.randn(sum(qlens), num_heads, 16, generator=gen)
    cu = torch.tensor([0, 2, 20, 30], dtype=torch.int32)
    prefill = prefill_attention_ref(flat, kv.k_cache, kv.v_cache, cu, kv.context_lens,
                                    kv.block_tables, scale, window=window)
    for b in range(len(lens)):
        k, v = kv.keys[b], kv.values[b]
        torch.testing.assert_close(decode[b], naive_causal_attention(q[b], k, v, scale, window),
                                   **TOL)
        torch.testing.assert_close(
            single[b], naive_causal_attention(q[b, -1:], k, v, scale, window)[0], **TOL)
        rows = slice(int(cu[b]), int(cu[b + 1]))
        torch.testing.assert_close(
            prefill[rows], naive_causal_attention(flat[rows], k, v, scale, window), **TOL)


def test_attended_pairs_closed_form_matches_a_loop():
    from kernels._paged_attention import attended_pairs

    for context_len in range(0, 25):
        for num_q in range(0, context_len + 1):
            for window in (None, 1, 3, 8, 30):
                expected = sum(min(t + 1, window or t + 1)
                               for t in range(context_len - num_q, context_len))
                assert attended_pairs(context_len, num_q, window) == expected
