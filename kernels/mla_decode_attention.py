"""MLA decode attention over a paged latent cache (FlashMLA-style, absorbed weights).

With W_UK folded into the query and W_UV into the output, DeepSeek-V2's attention is
multi-query attention over one latent row per token: keys are the whole row
[c_kv (Dl), k_pe (Dr)], values its first Dl dims, the same bytes.  A program takes
BLOCK_H query heads of one sequence and streams the sequence's latent rows once: each
tile of rows is loaded one time and serves both the scores (over Dl + Dr) and the
value accumulation (over Dl) of every head in the tile.  The Dl and Dr parts are
separate tiles, so neither needs padding to a power of two of their sum (512 + 64).

Split-K as in paged_decode_attention: the context's cache blocks are cut into
`num_splits` ranges, each split writes an unnormalised partial output and its
log2-sum-exp, and `_paged_decode_reduce_kernel` merges them.  Softmax runs in fp32,
in the log2 domain (scale pre-multiplied by log2(e)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, dot_precision, is_compiled
from kernels._paged_attention import LOG2E, gather_kv_ref
from kernels.cost import KernelCost
from kernels.paged_decode_attention import _paged_decode_reduce_kernel, default_num_splits

# Query heads per program (vLLM's Triton MLA decode uses 16 too): the fp32 accumulator
# (16 x 512) stays in registers, and 16 is the smallest M tl.dot accepts.
BLOCK_H = 16


@triton.jit
def _mla_decode_kernel(
    q_ptr, cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, lse_ptr,  # out: final output or fp32 partials; lse: per-split log2-sum-exp
    qk_scale, num_heads, block_size,
    stride_qb, stride_qh, stride_qd,
    stride_cb, stride_co, stride_cd,
    stride_btb,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls,
    KV_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DL: tl.constexpr, BLOCK_DR: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    offs_dl = tl.arange(0, BLOCK_DL)
    offs_dr = tl.arange(0, BLOCK_DR)
    dl_mask = offs_dl < KV_RANK
    dr_mask = offs_dr < ROPE_DIM
    q_row = q_ptr + seq * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(q_row + offs_dl[None, :] * stride_qd,
                     mask=head_mask[:, None] & dl_mask[None, :], other=0.0)  # (H, DL)
    q_pe = tl.load(q_row + (KV_RANK + offs_dr[None, :]) * stride_qd,
                   mask=head_mask[:, None] & dr_mask[None, :], other=0.0)  # (H, DR)

    num_blocks = tl.cdiv(context_len, block_size)
    blocks_per_split = tl.cdiv(num_blocks, NUM_SPLITS)
    start = split * blocks_per_split * block_size
    end = tl.minimum(context_len, (split + 1) * blocks_per_split * block_size)

    acc = tl.zeros([BLOCK_H, BLOCK_DL], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    table = block_tables_ptr + seq * stride_btb
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n  # (N,) token positions
        in_range = pos < end
        block_id = tl.load(table + pos // block_size, mask=in_range, other=0).to(tl.int64)
        row = cache_ptr + block_id * stride_cb + (pos % block_size) * stride_co  # (N,)
        # One load of the latent rows: c_kv serves as key part and as value.
        kv = tl.load(row[:, None] + offs_dl[None, :] * stride_cd,
                     mask=in_range[:, None] & dl_mask[None, :], other=0.0)  # (N, DL)
        k_pe = tl.load(row[:, None] + (KV_RANK + offs_dr[None, :]) * stride_cd,
                       mask=in_range[:, None] & dr_mask[None, :], other=0.0)  # (N, DR)
        s = tl.dot(q_nope, tl.trans(kv), input_precision=DOT_PRECISION)
        s += tl.dot(q_pe, tl.trans(k_pe), input_precision=DOT_PRECISION)
        s = tl.where(in_range[None, :], s * qk_scale, float("-inf"))  # (H, N)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid inf - inf
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # (H, N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # an empty split stays 0
    o_ptrs = (out_ptr + seq * stride_ob + heads[:, None] * stride_oh + split * stride_os
              + offs_dl[None, :] * stride_od)
    tl.store(o_ptrs, out, mask=head_mask[:, None] & dl_mask[None, :])
    if NUM_SPLITS > 1:
        is_empty = l_i == 0.0
        lse = tl.where(is_empty, float("-inf"), m_i + tl.log2(tl.where(is_empty, 1.0, l_i)))
        tl.store(lse_ptr + seq * stride_lb + heads * stride_lh + split * stride_ls, lse,
                 mask=head_mask)


def _check_latent(q: torch.Tensor, cache: torch.Tensor, values: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor) -> int:
    """Shape checks shared by the launcher and the reference; returns kv_lora_rank."""
    assert q.dim() == 3, f"q must be (B, H, Dl + Dr), got {tuple(q.shape)}"
    assert cache.dim() == 4 and cache.shape[2] == 1, (
        f"cache must be (num_blocks, block_size, 1, Dl + Dr), got {tuple(cache.shape)}")
    assert cache.shape[-1] == q.shape[-1], (cache.shape, q.shape)
    assert values.shape[:3] == cache.shape[:3] and values.shape[-1] < cache.shape[-1], (
        values.shape, cache.shape)
    assert q.dtype == cache.dtype == values.dtype, (q.dtype, cache.dtype, values.dtype)
    assert block_tables.dim() == 2 and block_tables.dtype == torch.int32, block_tables.dtype
    assert block_tables.shape[0] == q.shape[0] and context_lens.shape == (q.shape[0],)
    assert context_lens.dtype == torch.int32, context_lens.dtype
    return int(values.shape[-1])


def mla_decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    values: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """One new query token per sequence over its paged latent cache.

    q: (B, H, Dl + Dr) absorbed queries [W_UK^T q_nope, q_pe]; cache: (num_blocks,
    block_size, 1, Dl + Dr) latent rows [c_kv, k_pe]; values: cache[..., :Dl] (a strided
    view: the kernel reads the values from the same loads as the keys);
    block_tables: (B, max_blocks) int32; context_lens: (B,) int32, including the query.
    Returns (B, H, Dl) in q.dtype.
    """
    rank = _check_latent(q, cache, values, block_tables, context_lens)
    assert values.data_ptr() == cache.data_ptr() and values.stride() == cache.stride(), (
        "values must be the view cache[..., :kv_lora_rank]: the kernel loads each latent "
        "row once for keys and values")
    assert block_tables.stride(1) == 1, "block_tables rows must be contiguous"
    batch, num_heads, head_dim = q.shape
    block_size = cache.shape[1]
    compiled = is_compiled(q)
    num_head_blocks = cdiv(num_heads, BLOCK_H)
    if num_splits is None:
        # Bound the context by the block table width: no device sync, CUDA-graph safe.
        max_context = block_tables.shape[1] * block_size
        num_splits = default_num_splits(batch, num_head_blocks, max_context, q.device)
    assert num_splits >= 1, num_splits

    out = torch.empty(batch, num_heads, rank, dtype=q.dtype, device=q.device)
    if num_splits == 1:
        partial = out.unsqueeze(2)  # (B, H, 1, Dl): the kernel writes the output itself
        lse = out  # unused with one split
        lse_strides: tuple[int, ...] = (0, 0, 0)
    else:
        partial = torch.empty(batch, num_heads, num_splits, rank, dtype=torch.float32,
                              device=q.device)  # (B, H, S, Dl)
        lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        lse_strides = lse.stride()
    if batch == 0:
        return out

    c_strides = (cache.stride(0), cache.stride(1), cache.stride(3))
    _mla_decode_kernel[(batch, num_head_blocks, num_splits)](
        q, cache, block_tables, context_lens, partial, lse,
        scale * LOG2E, num_heads, block_size,
        *q.stride(), *c_strides, block_tables.stride(0), *partial.stride(), *lse_strides,
        KV_RANK=rank, ROPE_DIM=head_dim - rank, NUM_SPLITS=num_splits,
        BLOCK_H=BLOCK_H, BLOCK_N=32 if compiled else 16,
        BLOCK_DL=triton.next_power_of_2(rank),
        BLOCK_DR=max(16, triton.next_power_of_2(head_dim - rank)),
        DOT_PRECISION=dot_precision(q.dtype), num_warps=4 if rank <= 256 else 8,
    )
    if num_splits > 1:
        num_rows = batch * num_heads  # partial (rows, S, Dl), lse (rows, S), out (rows, Dl)
        block_r = 4 if compiled else 64
        _paged_decode_reduce_kernel[(cdiv(num_rows, block_r),)](
            partial, lse, out, lse, num_rows, num_heads,  # MLA has no sinks (never read)
            V_HEAD_DIM=rank, NUM_SPLITS=num_splits, BLOCK_R=block_r,
            BLOCK_DV=triton.next_power_of_2(rank), HAS_SINKS=False,
        )
    return out


def mla_decode_attention_ref(
    q: torch.Tensor,
    cache: torch.Tensor,
    values: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Torch reference (and CPU backend): gather each sequence's latent rows, fp32 softmax.

    `values` may be any (num_blocks, block_size, 1, Dv) tensor here.  `num_splits` is
    accepted for signature compatibility; the result does not depend on it.
    """
    del num_splits
    _check_latent(q, cache, values, block_tables, context_lens)
    max_context = int(context_lens.max()) if context_lens.numel() else 0
    keys = gather_kv_ref(cache, block_tables, max_context)[:, 0]  # (B, L, Dl + Dr)
    vals = gather_kv_ref(values, block_tables, max_context)[:, 0]  # (B, L, Dl)
    ctx = context_lens.to(device=q.device, dtype=torch.long)
    is_pad = torch.arange(max_context, device=q.device) >= ctx[:, None]  # (B, L)
    # Slots past a sequence's end may hold anything, even NaN (0 * NaN = NaN in P @ V).
    vals = vals.float().masked_fill_(is_pad[:, :, None], 0.0)
    scores = torch.einsum("bhd,bld->bhl", q.float(), keys.float()) * scale  # (B, H, L)
    scores.masked_fill_(is_pad[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, vals).to(q.dtype)  # (B, H, Dl)


def mla_decode_attention_cost(
    batch: int,
    num_heads: int,
    kv_lora_rank: int,
    rope_dim: int,
    context_lens: list[int] | int,
    dtype_bytes: int,
) -> KernelCost:
    """Latent rows read once per sequence (shared by every head) + queries in + outputs out.

    FLOPs: scores over Dl + Dr and the value pass over Dl, for every head and key.  Bytes
    are the compulsory traffic, the latent once per sequence, as the roofline counts it;
    the kernel issues one read per BLOCK_H heads (8 for DeepSeek-V2's 128 heads).
    """
    lens = [context_lens] * batch if isinstance(context_lens, int) else list(context_lens)
    assert len(lens) == batch, (len(lens), batch)
    keys = sum(lens)
    latent_bytes = keys * (kv_lora_rank + rope_dim) * dtype_bytes
    io_bytes = batch * num_heads * (2 * kv_lora_rank + rope_dim) * dtype_bytes
    flops = 2.0 * keys * num_heads * (2 * kv_lora_rank + rope_dim)
    return KernelCost(flops=flops, bytes=float(latent_bytes + io_bytes))
