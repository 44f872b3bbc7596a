"""Variable-length causal prefill attention over a paged KV cache (FlashAttention style).

q holds the new tokens of B sequences back to back; sequence b owns rows
cu_seqlens_q[b]:cu_seqlens_q[b+1] and has context_lens[b] tokens in total, so its
query j sits at position context_lens[b] - qlen_b + j.  Every key and value, the
earlier context as well as the new tokens (already written by store_kv), is read from
the paged cache: chunked prefill and prefix-cache hits need nothing special.

Grid (query tile, KV head).  A tile holds BLOCK_Q consecutive tokens of one sequence
times the Hq // Hkv query heads sharing a KV head, so each KV tile is loaded once per
group.  Sequence b's tiles get grid indices starting at cu_seqlens_q[b] // BLOCK_Q + b;
that leaves no overlap, bounds the grid by T // BLOCK_Q + B without reading the lengths
on the host, and a program finds its sequence by binary search over cu_seqlens_q.
Programs that land past their sequence's last tile exit at once.

A quantized cache (int8 / float8_e4m3fn with per-token, per-head scales, see
`kernels/kv_quant.py`) is passed with its `k_scales` / `v_scales` and read in place.
Attention sinks (`sinks`, one logit per query head, gpt-oss) start each row's softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import dot_precision, is_compiled
from kernels._paged_attention import (
    LOG2E,
    attend_kv_range,
    attended_pairs,
    attention_ref,
    check_cache,
    chunk_start,
    dequantized_rows,
    gather_kv_ref,
    kv_tokens_read,
    scale_args,
    sink_init,
    sinks_arg,
    window_arg,
)
from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module


@triton.jit
def _find_sequence(cu_seqlens_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with cu_seqlens[b] // BLOCK_Q + b <= tile (binary search)."""
    # Typed so both are int32 tensors when compiled (1 would otherwise be a constexpr).
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, cu_seqlens_ptr, context_lens_ptr, block_tables_ptr,
    out_ptr, k_scales_ptr, v_scales_ptr, sinks_ptr, qk_scale, window, chunk, num_seqs,
    block_size,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_ksb, stride_kso, stride_ksh,
    stride_vsb, stride_vso, stride_vsh,
    stride_btb,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_QUANT: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(cu_seqlens_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_Q + seq)
    if local_tile * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    first_q_pos = context_len - q_len + local_tile * BLOCK_Q

    # Row r is token r // GROUP of this tile, query head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, BLOCK_M)
    tok = local_tile * BLOCK_Q + rows // GROUP  # index within the sequence's new tokens
    head = kv_head * GROUP + rows % GROUP
    row_mask = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = tl.where(row_mask, context_len - q_len + tok, -1)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (q_ptr + (q_start + tok[:, None]) * stride_qt + head[:, None] * stride_qh
              + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)

    # Keys from the first query's window (or chunk) start to the last query of the tile.
    start = tl.maximum(tl.maximum(first_q_pos - window + 1, 0),
                       chunk_start(first_q_pos, chunk))
    end = tl.minimum(first_q_pos + BLOCK_Q, context_len)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i, m_i = sink_init(sinks_ptr, head, row_mask, HAS_SINKS, BLOCK_M)
    acc, l_i, m_i = attend_kv_range(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_btb,
        k_scales_ptr, v_scales_ptr, kv_head, start, end, window, chunk, qk_scale,
        stride_kb, stride_ko, stride_kh, stride_kd, stride_vb, stride_vo, stride_vh, stride_vd,
        stride_ksb, stride_kso, stride_ksh, stride_vsb, stride_vso, stride_vsh,
        block_size, HEAD_DIM, V_HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_DV, DOT_PRECISION, KV_QUANT,
    )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    offs_dv = tl.arange(0, BLOCK_DV)
    o_ptrs = (out_ptr + (q_start + tok[:, None]) * stride_ot + head[:, None] * stride_oh
              + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out, mask=row_mask[:, None] & (offs_dv[None, :] < V_HEAD_DIM))


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens of B sequences over their paged KV cache.

    q: (T, Hq, D) new tokens of all sequences; cu_seqlens_q: (B+1,) int32 row offsets;
    context_lens: (B,) int32 total tokens per sequence (cached + new, all in the cache);
    block_tables: (B, max_blocks) int32.  A quantized cache comes with k_scales /
    v_scales (num_blocks, block_size, Hkv) float32.  `chunk`: chunked attention (a query
    sees only the earlier keys of its own chunk).  sinks: (Hq,) attention-sink logits or
    None.  Returns (T, Hq, Dv) in q.dtype.
    """
    check_cache(k_cache, v_cache, block_tables, q, k_scales, v_scales)
    assert q.dim() == 3, f"q must be (T, Hq, D), got {tuple(q.shape)}"
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    v_head_dim = v_cache.shape[-1]
    batch = context_lens.shape[0]
    assert k_cache.shape[-1] == head_dim, (k_cache.shape, q.shape)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads, {num_kv_heads} KV heads"
    assert cu_seqlens_q.shape == (batch + 1,) and cu_seqlens_q.dtype == torch.int32
    assert context_lens.dtype == torch.int32 and block_tables.shape[0] == batch
    group = num_heads // num_kv_heads

    out = torch.empty(num_tokens, num_heads, v_head_dim, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or batch == 0:
        return out
    compiled = is_compiled(q)
    # Rows per tile = BLOCK_Q tokens x GROUP heads, padded to a power of two (>= 16 for tl.dot).
    rows_target = 64
    block_q = max(1, rows_target // triton.next_power_of_2(group))
    block_m = max(16, triton.next_power_of_2(block_q * group))
    block_n = 64 if compiled or head_dim <= 64 else 32
    grid = (num_tokens // block_q + batch, num_kv_heads)
    ks, vs, *scale_strides = scale_args(k_scales, v_scales, context_lens)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, out, ks, vs,
        sinks_arg(sinks, num_heads, context_lens), scale * LOG2E, window_arg(window),
        window_arg(chunk), batch, block_size,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *scale_strides,
        block_tables.stride(0), *out.stride(),
        GROUP=group, HEAD_DIM=head_dim, V_HEAD_DIM=v_head_dim,
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_DV=triton.next_power_of_2(v_head_dim),
        DOT_PRECISION=dot_precision(q.dtype), KV_QUANT=k_scales is not None,
        HAS_SINKS=sinks is not None, num_warps=4 if head_dim <= 64 else 8,
    )
    return out


def prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference (and CPU backend): per sequence, gather its KV and run masked softmax.

    A quantized cache's gathered rows (one sequence's context) are dequantized to float32.
    """
    check_cache(k_cache, v_cache, block_tables, q, k_scales, v_scales)
    out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    starts = cu_seqlens_q.tolist()
    for b, context_len in enumerate(context_lens.tolist()):
        q_start, q_end = starts[b], starts[b + 1]
        if q_end == q_start:
            continue
        keys = gather_kv_ref(k_cache, block_tables[b], context_len)  # (Hkv, L, D)
        values = gather_kv_ref(v_cache, block_tables[b], context_len)  # (Hkv, L, Dv)
        if k_scales is not None and v_scales is not None:  # (Hkv, L) scales of those rows
            keys = dequantized_rows(keys, gather_kv_ref(
                k_scales.unsqueeze(-1), block_tables[b], context_len)[..., 0])
            values = dequantized_rows(values, gather_kv_ref(
                v_scales.unsqueeze(-1), block_tables[b], context_len)[..., 0])
        q_pos = torch.arange(context_len - (q_end - q_start), context_len, device=q.device)
        out[q_start:q_end] = attention_ref(
            q[None, q_start:q_end], keys[None], values[None], q_pos[None], scale, window,
            chunk, sinks)[0]
    return out


def prefill_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """C++ CPU kernel (kernels/csrc/attention.cpp, the `cpu` backend): the same causal
    attention, K/V read in place through the block table, work items of (sequence, KV
    head, query tile).  An int8 cache goes through kernels/csrc/attention_kvq.cpp.  The
    C++ kernels have no chunk mask and no attention sinks: a chunked or a sink layer falls
    back to `prefill_attention_ref`."""
    if chunk is not None or sinks is not None:
        return prefill_attention_ref(q, k_cache, v_cache, cu_seqlens_q, context_lens,
                                     block_tables, scale, window, k_scales, v_scales, chunk,
                                     sinks)
    if k_scales is not None or v_scales is not None:
        return cpu_module().prefill_attention_int8(  # type: ignore[no-any-return]
            q, k_cache, v_cache, k_scales, v_scales, cu_seqlens_q, context_lens, block_tables,
            scale, window)
    return cpu_module().prefill_attention(  # type: ignore[no-any-return]
        q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale, window)


def prefill_attention_cost(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    query_lens: list[int],
    context_lens: list[int],
    dtype_bytes: int,
    window: int | None = None,
) -> KernelCost:
    """Each sequence's KV read once per KV head (the windowed span when windowed) + q + out.

    FLOPs count QK^T and PV over the keys each new token attends to (causal, windowed).
    """
    assert len(query_lens) == len(context_lens), (query_lens, context_lens)
    kv_bytes_per_token = num_kv_heads * (head_dim + v_head_dim) * dtype_bytes
    pairs = list(zip(query_lens, context_lens, strict=True))
    kv_tokens = sum(kv_tokens_read(c, n, window) for n, c in pairs)
    io_bytes = sum(query_lens) * num_q_heads * (head_dim + v_head_dim) * dtype_bytes
    pairs_total = sum(attended_pairs(c, n, window) for n, c in pairs)
    flops = 2.0 * pairs_total * num_q_heads * (head_dim + v_head_dim)
    return KernelCost(flops=flops, bytes=float(kv_tokens * kv_bytes_per_token + io_bytes))
