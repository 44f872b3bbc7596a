"""Paged decode attention: one (or a few) new query tokens per sequence over its KV cache.

Grid (sequence, KV head, split).  A program loads the query rows of a whole GQA group
(Hq // Hkv heads x Q query tokens) into one tile, so every KV block is read once per
KV head rather than once per query head.  The context is cut into `num_splits`
contiguous ranges of cache blocks (split-K, as FlashDecoding does): each split writes
an unnormalised partial output and its log-sum-exp, and `_paged_decode_reduce_kernel`
merges the splits.  Many splits keep the GPU busy when the batch is small and contexts
are long; with one split the main kernel writes the output directly.

With Q > 1 query tokens (speculative verification) query i sits at position
context_len - Q + i and attends causally.  A sliding window restricts the blocks a
program visits, so blocks fully outside the window are never read; so does a chunk
(Llama-4's chunked attention: a query sees only the keys of its own chunk).

A quantized cache (int8 / float8_e4m3fn with per-token, per-head scales, see
`kernels/kv_quant.py`) is passed with its `k_scales` / `v_scales` and read in place,
one byte per value: the scales are folded into the scores and weights per key.

Attention sinks (`sinks`, one logit per query head, gpt-oss) start each row's softmax
(`_paged_attention.sink_init`); with several splits the reduce kernel adds them once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, dot_precision, is_compiled, num_compute_units
from kernels._paged_attention import (
    LOG2E,
    attend_kv_range,
    attended_pairs,
    attention_ref,
    check_cache,
    chunk_start,
    dequantized_rows,
    kv_tokens_read,
    scale_args,
    sink_init,
    sinks_arg,
    window_arg,
)
from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module

# Below this many context tokens per split the merge costs more than the parallelism buys.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32


@triton.jit
def _paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, lse_ptr,  # out: final output or fp32 partials; lse: per-split log2-sum-exp
    k_scales_ptr, v_scales_ptr,  # KV_QUANT: (num_blocks, block_size, Hkv) float32
    sinks_ptr,  # HAS_SINKS: (Hq,) logits (with several splits the reduce adds them)
    qk_scale, window, chunk, num_q_tokens, block_size,
    stride_qb, stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_ksb, stride_kso, stride_ksh,
    stride_vsb, stride_vso, stride_vsh,
    stride_btb,
    stride_ob, stride_ot, stride_oh, stride_os, stride_od,
    stride_lb, stride_lt, stride_lh, stride_ls,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_QUANT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)

    # Row r of the tile is query token r // GROUP of query head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_mask = tok < num_q_tokens
    q_pos = tl.where(row_mask, context_len - num_q_tokens + tok, -1)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (q_ptr + seq * stride_qb + tok[:, None] * stride_qt + head[:, None] * stride_qh
              + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)

    # Visible positions [lo, hi): the earliest query's window (or chunk) start up to the end.
    first_q = context_len - num_q_tokens
    lo = tl.maximum(tl.maximum(first_q - window + 1, 0), chunk_start(first_q, chunk))
    hi = context_len
    first_block = lo // block_size
    num_blocks = tl.cdiv(hi, block_size) - first_block
    blocks_per_split = tl.cdiv(num_blocks, NUM_SPLITS)
    start = tl.maximum(lo, (first_block + split * blocks_per_split) * block_size)
    end = tl.minimum(hi, (first_block + (split + 1) * blocks_per_split) * block_size)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i, m_i = sink_init(sinks_ptr, head, row_mask, HAS_SINKS, BLOCK_M)
    acc, l_i, m_i = attend_kv_range(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_btb,
        k_scales_ptr, v_scales_ptr, kv_head, start, end, window, chunk, qk_scale,
        stride_kb, stride_ko, stride_kh, stride_kd, stride_vb, stride_vo, stride_vh, stride_vd,
        stride_ksb, stride_kso, stride_ksh, stride_vsb, stride_vso, stride_vsh,
        block_size, HEAD_DIM, V_HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_DV, DOT_PRECISION, KV_QUANT,
    )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # rows that saw nothing stay 0
    offs_dv = tl.arange(0, BLOCK_DV)
    o_ptrs = (out_ptr + seq * stride_ob + tok[:, None] * stride_ot + head[:, None] * stride_oh
              + split * stride_os + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out, mask=row_mask[:, None] & (offs_dv[None, :] < V_HEAD_DIM))
    if NUM_SPLITS > 1:
        is_empty = l_i == 0.0
        lse = tl.where(is_empty, float("-inf"), m_i + tl.log2(tl.where(is_empty, 1.0, l_i)))
        l_ptrs = lse_ptr + seq * stride_lb + tok * stride_lt + head * stride_lh + split * stride_ls
        tl.store(l_ptrs, lse, mask=row_mask)


@triton.jit
def _paged_decode_reduce_kernel(
    partial_ptr, lse_ptr, out_ptr, sinks_ptr, num_rows, num_heads,
    V_HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    # rows: (seq, query token, query head) flattened; a sink joins as one more "split"
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_mask = rows < num_rows
    mask = row_mask[:, None] & (offs_dv[None, :] < V_HEAD_DIM)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    total, m_i = sink_init(sinks_ptr, rows % num_heads, row_mask, HAS_SINKS, BLOCK_R)
    for split in range(NUM_SPLITS):
        lse = tl.load(lse_ptr + rows * NUM_SPLITS + split, mask=row_mask, other=float("-inf"))
        part = tl.load(
            partial_ptr + (rows[:, None] * NUM_SPLITS + split) * V_HEAD_DIM + offs_dv[None, :],
            mask=mask, other=0.0,
        )
        m_new = tl.maximum(m_i, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        weight = tl.exp2(lse - m_safe)  # 0 for empty splits
        acc = acc * alpha[:, None] + part * weight[:, None]
        total = total * alpha + weight
        m_i = m_new
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(out_ptr + rows[:, None] * V_HEAD_DIM + offs_dv[None, :], out, mask=mask)


def default_num_splits(
    batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Splits per (sequence, KV head): enough programs for ~2 waves, >= 256 tokens per split."""
    programs = batch * num_kv_heads
    by_occupancy = cdiv(2 * num_compute_units(device), programs)
    by_length = max(1, max_context // MIN_TOKENS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    num_splits: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the last Q tokens of each sequence over its paged KV cache.

    q: (B, Hq, D) or (B, Q, Hq, D); k_cache: (num_blocks, block_size, Hkv, D);
    v_cache: (num_blocks, block_size, Hkv, Dv); block_tables: (B, max_blocks) int32;
    context_lens: (B,) int32, total tokens of each sequence including the Q queries.
    A quantized cache (int8 / float8_e4m3fn) comes with k_scales / v_scales
    (num_blocks, block_size, Hkv) float32.  `chunk`: chunked attention (a query sees only
    the earlier keys of its own chunk of `chunk` positions).  sinks: (Hq,) attention-sink
    logits or None.  Returns q's shape with D replaced by Dv, in q.dtype.
    """
    check_cache(k_cache, v_cache, block_tables, q, k_scales, v_scales)
    is_single = q.dim() == 3
    q4 = q.unsqueeze(1) if is_single else q  # (B, Q, Hq, D)
    assert q4.dim() == 4, f"q must be (B, Hq, D) or (B, Q, Hq, D), got {tuple(q.shape)}"
    batch, num_q, num_heads, head_dim = q4.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    v_head_dim = v_cache.shape[-1]
    assert k_cache.shape[-1] == head_dim, (k_cache.shape, q.shape)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads, {num_kv_heads} KV heads"
    assert block_tables.shape[0] == batch and context_lens.shape == (batch,)
    assert context_lens.dtype == torch.int32, context_lens.dtype
    group = num_heads // num_kv_heads
    if num_splits is None:
        # Bound the context by the block table width: no device sync, CUDA-graph safe.
        max_context = block_tables.shape[1] * block_size
        num_splits = default_num_splits(batch, num_kv_heads, max_context, q.device)
    assert num_splits >= 1, num_splits

    out = torch.empty(batch, num_q, num_heads, v_head_dim, dtype=q.dtype, device=q.device)
    if num_splits == 1:
        partial = out.unsqueeze(3)  # (B, Q, Hq, 1, Dv): the kernel writes the output itself
        lse = out  # unused: the kernel stores no log-sum-exp with one split
        lse_strides: tuple[int, ...] = (0, 0, 0, 0)
    else:
        partial = torch.empty(  # (B, Q, Hq, S, Dv)
            batch, num_q, num_heads, num_splits, v_head_dim, dtype=torch.float32, device=q.device
        )
        lse = torch.empty(batch, num_q, num_heads, num_splits, dtype=torch.float32, device=q.device)
        lse_strides = lse.stride()

    compiled = is_compiled(q)
    block_m = max(16, triton.next_power_of_2(num_q * group))
    block_n = 64 if compiled or block_m <= 32 else 32
    grid = (batch, num_kv_heads, num_splits)
    ks, vs, *scale_strides = scale_args(k_scales, v_scales, context_lens)
    sinks_ptr = sinks_arg(sinks, num_heads, context_lens)
    _paged_decode_attention_kernel[grid](
        q4, k_cache, v_cache, block_tables, context_lens, partial, lse, ks, vs, sinks_ptr,
        scale * LOG2E, window_arg(window), window_arg(chunk), num_q, block_size,
        *q4.stride(), *k_cache.stride(), *v_cache.stride(), *scale_strides,
        block_tables.stride(0), *partial.stride(), *lse_strides,
        GROUP=group, NUM_SPLITS=num_splits, HEAD_DIM=head_dim, V_HEAD_DIM=v_head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim), DOT_PRECISION=dot_precision(q.dtype),
        KV_QUANT=k_scales is not None, HAS_SINKS=sinks is not None and num_splits == 1,
        num_warps=4 if block_m * block_n <= 64 * 64 else 8,
    )
    if num_splits > 1:
        num_rows = batch * num_q * num_heads
        block_r = 4 if compiled else 64
        _paged_decode_reduce_kernel[(cdiv(num_rows, block_r),)](
            partial, lse, out, sinks_ptr, num_rows, num_heads,
            V_HEAD_DIM=v_head_dim, NUM_SPLITS=num_splits, BLOCK_R=block_r,
            BLOCK_DV=triton.next_power_of_2(v_head_dim), HAS_SINKS=sinks is not None,
        )
    return out.squeeze(1) if is_single else out


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    num_splits: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference (and CPU backend): gather each sequence's KV, masked fp32 softmax.

    A quantized cache's gathered rows (only this batch's context, never the whole pool)
    are dequantized to float32.  `num_splits` is accepted for signature compatibility;
    the result does not depend on it.
    """
    del num_splits
    check_cache(k_cache, v_cache, block_tables, q, k_scales, v_scales)
    is_single = q.dim() == 3
    q4 = q.unsqueeze(1) if is_single else q  # (B, Q, Hq, D)
    batch, num_q = q4.shape[:2]
    block_size = k_cache.shape[1]
    max_context = int(context_lens.max()) if context_lens.numel() else 0
    num_blocks = max(1, -(-max_context // block_size))
    ids = block_tables[:, :num_blocks].long()  # (B, nb)
    # One gather per cache; the (B, Hkv, L, D) views below are transposes, not copies.
    keys = k_cache[ids].flatten(1, 2)[:, :max_context]  # (B, L, Hkv, D), a fresh copy
    values = v_cache[ids].flatten(1, 2)[:, :max_context]  # (B, L, Hkv, Dv), a fresh copy
    if k_scales is not None and v_scales is not None:  # (B, L, Hkv) scales, float32 rows
        keys = dequantized_rows(keys, k_scales[ids].flatten(1, 2)[:, :max_context])
        values = dequantized_rows(values, v_scales[ids].flatten(1, 2)[:, :max_context])
    ctx = context_lens.to(device=q.device, dtype=torch.long)
    # Slots past a shorter sequence's end hold stale data, maybe NaN, and masking the
    # score does not help there (NaN + -inf = NaN; 0 * NaN = NaN in P @ V): zero them.
    is_pad = torch.arange(max_context, device=q.device) >= ctx[:, None]  # (B, L)
    if batch > 1 and bool(is_pad.any()):
        keys.masked_fill_(is_pad[:, :, None, None], 0.0)
        values.masked_fill_(is_pad[:, :, None, None], 0.0)
    q_pos = ctx[:, None] - num_q + torch.arange(num_q, device=q.device)  # (B, Q)
    out = attention_ref(q4, keys.transpose(1, 2), values.transpose(1, 2), q_pos, scale,
                        window, chunk, sinks)  # (B, Q, Hq, Dv)
    return out.squeeze(1) if is_single else out


def paged_decode_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    num_splits: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """C++ CPU kernel (kernels/csrc/attention.cpp, the `cpu` backend): the same attention,
    K/V read in place through the block table (no gather), fp32 online softmax, one work
    item per (sequence, KV head).  An int8 cache goes through kernels/csrc/attention_kvq.cpp
    (one byte per value read, scales folded in per key).  `num_splits` is accepted for
    signature compatibility.  The C++ kernels have no chunk mask and no attention sinks: a
    chunked or a sink layer falls back to the torch reference (`paged_decode_attention_ref`;
    the same values, not the C++ speed).
    """
    if chunk is not None or sinks is not None:
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens,
                                          scale, window, num_splits, k_scales, v_scales, chunk,
                                          sinks)
    del num_splits
    if k_scales is not None or v_scales is not None:
        return cpu_module().paged_decode_attention_int8(  # type: ignore[no-any-return]
            q, k_cache, v_cache, k_scales, v_scales, block_tables, context_lens, scale, window)
    return cpu_module().paged_decode_attention(  # type: ignore[no-any-return]
        q, k_cache, v_cache, block_tables, context_lens, scale, window)


def paged_decode_attention_cost(
    batch: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    context_lens: list[int] | int,
    dtype_bytes: int,
    num_query_tokens: int = 1,
    window: int | None = None,
) -> KernelCost:
    """KV read once per KV head (only the window when windowed) + queries in + outputs out.

    FLOPs count QK^T and PV over the keys each query token actually attends to.
    """
    lens = [context_lens] * batch if isinstance(context_lens, int) else list(context_lens)
    assert len(lens) == batch, (len(lens), batch)
    kv_bytes_per_token = num_kv_heads * (head_dim + v_head_dim) * dtype_bytes
    kv_tokens = sum(kv_tokens_read(n, num_query_tokens, window) for n in lens)
    io_bytes = batch * num_query_tokens * num_q_heads * (head_dim + v_head_dim) * dtype_bytes
    pairs_total = sum(attended_pairs(n, num_query_tokens, window) for n in lens)
    flops = 2.0 * pairs_total * num_q_heads * (head_dim + v_head_dim)
    return KernelCost(flops=flops, bytes=float(kv_tokens * kv_bytes_per_token + io_bytes))
