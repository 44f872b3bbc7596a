"""Pieces shared by the paged decode and prefill attention kernels.

`attend_kv_range` is the inner loop of both Triton kernels: it streams the keys and
values at positions [start, end) of one sequence out of the paged cache, one tile of
BLOCK_N tokens at a time, and folds them into an online softmax (FlashAttention) for
a tile of query rows that all share one KV head.  Block ids are looked up per token,
so a tile may span several cache blocks and the cache block size need not be a power
of two.  Scores live in the log2 domain (scale pre-multiplied by log2(e)) so the
kernel uses exp2.

A quantized cache (KV_QUANT: int8 or float8_e4m3fn values with one float32 scale per
token per KV head, `kernels/kv_quant.py`) is read as it lies: the one-byte values are
converted to the query's dtype (exact: +-127 and every e4m3 value fit bfloat16 and
float16) and the scales are folded in per key, into the scores after Q K^T and into the
softmax weights before P V, so nothing is dequantized into a copy.

Attention sinks (gpt-oss): one learned logit per query head joins every softmax
denominator with a zero value, so a row's weights sum to less than one.  The kernels start
each row's online softmax from it (running max = the sink in the log2 domain, running sum
= 1); the references add it as an extra column (`attention_ref`).

`gather_kv_ref` and `attention_ref` are the torch building blocks of the references.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.kv_quant import check_scales, dequantize_kv_ref, is_quantized

LOG2E = 1.0 / math.log(2.0)
# Stand-in for "no sliding window": larger than any position difference.
NO_WINDOW = 1 << 30


def window_arg(window: int | None) -> int:
    """A window (or a chunk) as the kernels take it: NO_WINDOW for none."""
    if window is None:
        return NO_WINDOW
    assert window > 0, f"window must be a positive token count, got {window}"
    return int(window)


@triton.jit
def chunk_start(pos, chunk):
    """First position of the attention chunk holding `pos` (chunk NO_WINDOW: 0)."""
    return pos - pos % chunk


@triton.jit
def attend_kv_range(
    acc, l_i, m_i,  # running output (BLOCK_M, BLOCK_DV), sum and max (BLOCK_M,), fp32
    q,  # (BLOCK_M, BLOCK_D) query rows of one KV-head group
    q_pos,  # (BLOCK_M,) position of each query row; -1 for padding rows
    k_cache_ptr, v_cache_ptr, block_table_ptr,  # block_table_ptr: this sequence's row
    k_scales_ptr, v_scales_ptr,  # KV_QUANT: (num_blocks, block_size, Hkv) float32
    kv_head, start, end, window, chunk, qk_scale,  # qk_scale = softmax scale * log2(e)
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_ksb, stride_kso, stride_ksh,
    stride_vsb, stride_vso, stride_vsh,
    block_size,
    HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KV_QUANT: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_mask = offs_d < HEAD_DIM
    dv_mask = offs_dv < V_HEAD_DIM
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n  # (BLOCK_N,) token positions
        in_range = pos < end
        block_id = tl.load(block_table_ptr + pos // block_size, mask=in_range, other=0)
        block_id = block_id.to(tl.int64)  # cache offsets overflow int32 on large pools
        offset = pos % block_size
        k_ptrs = (k_cache_ptr + block_id[:, None] * stride_kb + offset[:, None] * stride_ko
                  + kv_head * stride_kh + offs_d[None, :] * stride_kd)
        k = tl.load(k_ptrs, mask=in_range[:, None] & d_mask[None, :], other=0.0)  # (N, D)
        if KV_QUANT:
            k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (M, N)
        if KV_QUANT:  # each key's scale multiplies its column of scores
            k_scale = tl.load(k_scales_ptr + block_id * stride_ksb + offset * stride_kso
                              + kv_head * stride_ksh, mask=in_range, other=0.0)  # (N,)
            s = s * k_scale[None, :]
        delta = q_pos[:, None] - pos[None, :]  # query position - key position
        visible = (delta >= 0) & (delta < window) & in_range[None, :]
        # chunked attention: only the keys of the query's own chunk (chunk NO_WINDOW: all)
        visible = visible & (pos[None, :] >= q_pos[:, None] - q_pos[:, None] % chunk)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep max -inf; subtract 0 there to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # (M, N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = (v_cache_ptr + block_id[:, None] * stride_vb + offset[:, None] * stride_vo
                  + kv_head * stride_vh + offs_dv[None, :] * stride_vd)
        v = tl.load(v_ptrs, mask=in_range[:, None] & dv_mask[None, :], other=0.0)  # (N, Dv)
        if KV_QUANT:  # each value's scale multiplies its column of weights
            v_scale = tl.load(v_scales_ptr + block_id * stride_vsb + offset * stride_vso
                              + kv_head * stride_vsh, mask=in_range, other=0.0)  # (N,)
            pv = (p * v_scale[None, :]).to(q.dtype)
            v = v.to(q.dtype)
        else:
            pv = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                q: torch.Tensor | None = None, k_scales: torch.Tensor | None = None,
                v_scales: torch.Tensor | None = None) -> None:
    """Shapes and dtypes of the caches and tables; with q, that q matches a float cache's
    dtype (a quantized one is read in q's dtype and comes with its scales)."""
    assert k_cache.dim() == 4 and v_cache.dim() == 4, "caches are (blocks, block_size, heads, dim)"
    assert k_cache.shape[:3] == v_cache.shape[:3], (k_cache.shape, v_cache.shape)
    assert k_cache.dtype == v_cache.dtype, (k_cache.dtype, v_cache.dtype)
    assert block_tables.dim() == 2 and block_tables.dtype == torch.int32, block_tables.dtype
    assert block_tables.stride(1) == 1, "block_tables rows must be contiguous"
    check_scales(k_cache, k_scales, "k_scales")
    check_scales(v_cache, v_scales, "v_scales")
    if q is not None and not is_quantized(k_cache):
        assert q.dtype == k_cache.dtype, (q.dtype, k_cache.dtype)


def scale_args(k_scales: torch.Tensor | None, v_scales: torch.Tensor | None,
               fallback: torch.Tensor) -> tuple[object, ...]:
    """(k_scales_ptr, v_scales_ptr, their six strides) for a kernel launch; `fallback`
    stands in for both pointers (never read) when the cache is not quantized."""
    if k_scales is None or v_scales is None:
        return (fallback, fallback, 0, 0, 0, 0, 0, 0)
    return (k_scales, v_scales, *k_scales.stride(), *v_scales.stride())


def dequantized_rows(cache: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """Gathered cache rows (..., D) as float32 when they are quantized (scales (...))."""
    return cache if scales is None else dequantize_kv_ref(cache, scales)


def gather_kv_ref(
    cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """The first `num_tokens` cached tokens of each sequence, heads first, contiguous.

    cache: (num_blocks, block_size, H, D); block_table: (B, max_blocks) or (max_blocks,).
    Returns (B, H, num_tokens, D) or (H, num_tokens, D): the layout batched matmuls want.
    """
    _, block_size, num_heads, dim = cache.shape
    num_blocks = max(1, -(-num_tokens // block_size))
    ids = block_table[..., :num_blocks]
    lead = ids.shape[:-1]
    # Whole blocks are contiguous: index_select copies them at memcpy speed (several
    # times faster than per-element advanced indexing), then one transposing copy.
    blocks = cache.index_select(0, ids.reshape(-1).long())  # (prod(lead) * nb, bs, H, D)
    tokens = blocks.view(*lead, num_blocks * block_size, num_heads, dim)[..., :num_tokens, :, :]
    out = torch.empty(*lead, num_heads, num_tokens, dim, dtype=cache.dtype, device=cache.device)
    out.copy_(tokens.transpose(-3, -2))  # (..., H, L, D)
    return out


@triton.jit
def sink_init(sinks_ptr, head, row_mask, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr):
    """(l_i, m_i) to start a row's online softmax from: empty, or holding the head's sink
    logit (log2 domain) with weight 1; padding rows start empty either way."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0).to(tl.float32)
        sink = sink * 1.4426950408889634  # log2(e): the kernels' scores are in base 2
        m_i = tl.where(row_mask, sink, float("-inf"))
        l_i = tl.where(row_mask, 1.0, 0.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    return l_i, m_i


def sinks_arg(sinks: torch.Tensor | None, num_heads: int,
              fallback: torch.Tensor) -> torch.Tensor:
    """The sinks pointer of a launch: (Hq,) contiguous logits, or `fallback` (never read)."""
    if sinks is None:
        return fallback
    assert sinks.shape == (num_heads,) and sinks.is_contiguous(), (sinks.shape, num_heads)
    return sinks


def _sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    visible: torch.Tensor, scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """Explicit fp32 softmax with one sink logit per query head as an extra column.

    q (B, Q, Hq, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv), visible (B, Q, L), sinks (Hq,).
    Returns (B, Q, Hq, Dv) in q.dtype; a query that sees no key gets zeros."""
    batch, num_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    qg = q.float().view(batch, num_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    scores = qg @ k.float()[:, :, None].transpose(-1, -2) * scale  # (B, Hkv, G, Q, L)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    sink = sinks.float().view(1, num_kv_heads, group, 1, 1).expand(batch, -1, -1, num_q, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = probs @ v.float()[:, :, None]  # (B, Hkv, G, Q, Dv)
    return out.permute(0, 3, 1, 2, 4).reshape(batch, num_q, num_heads, -1).to(q.dtype)


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    window: int | None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grouped-query attention of queries at positions q_pos over keys at 0..L-1, fp32 softmax.

    q: (B, Q, Hq, D); k: (B, Hkv, L, D); v: (B, Hkv, L, Dv); q_pos: (B, Q); sinks: (Hq,)
    logits in every softmax denominator (gpt-oss), or None.
    Key p is visible to a query at t iff p <= t and t - p < window, and with a chunk iff
    p // chunk == t // chunk as well.  Queries that see no key (padding: q_pos < 0) return
    zeros.  Returns (B, Q, Hq, Dv) in q.dtype.
    """
    num_keys = k.shape[2]
    keys_at = torch.arange(num_keys, device=q.device)
    delta = q_pos[:, :, None] - keys_at  # (B, Q, L)
    visible = delta >= 0
    if window is not None:
        visible &= delta < window
    if chunk is not None:
        visible &= keys_at >= (q_pos - q_pos.remainder(chunk))[:, :, None]
    if sinks is not None:
        return _sink_attention(q, k, v, visible, scale, sinks)
    batch, num_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    if num_q > 1:
        # Prefill: repeat K/V per query head (GQA expansion) and let torch's fused CPU
        # attention take a (B, 1, Q, L) mask broadcast over heads.
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, Hq, L, D)
            v = v.repeat_interleave(group, dim=1)  # (B, Hq, L, Dv)
        out = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float(), v.float(),
                                             attn_mask=visible[:, None], scale=scale)
        return out.nan_to_num_(0.0).transpose(1, 2).to(q.dtype)  # (B, Q, Hq, Dv)
    # Decode: fold each KV head's query group into the query axis, (B, Hkv, G, D), so
    # the KV is read once per KV head (what the Triton kernel does) instead of copied.
    qg = q.float().view(batch, num_kv_heads, group, head_dim)
    if window is None and chunk is None and bool((q_pos == num_keys - 1).all()):
        # Every sequence sees all L keys (equal lengths, no window): no mask to build.
        out = F.scaled_dot_product_attention(qg, k.float(), v.float(), scale=scale)
        return out.reshape(batch, 1, num_heads, v.shape[-1]).to(q.dtype)  # (B, Q, Hq, Dv)
    out = F.scaled_dot_product_attention(
        qg, k.float(), v.float(), attn_mask=visible[:, None], scale=scale)  # (B,Hkv,G,Dv)
    out = out.nan_to_num_(0.0)  # a query that sees no key (padding) gives zeros, not NaN
    return out.reshape(batch, 1, num_heads, v.shape[-1]).to(q.dtype)  # (B, Q, Hq, Dv)


def attended_pairs(context_len: int, num_query_tokens: int, window: int | None,
                   chunk: int | None = None) -> int:
    """(query, key) pairs attended by the last `num_query_tokens` positions of a sequence.

    The query at position t sees min(t + 1, window) keys (chunked: t % chunk + 1); closed
    form, no per-token loop.
    """
    first = context_len - num_query_tokens
    if chunk is not None:
        def upto(n: int) -> int:  # sum of (t % chunk + 1) for t in [0, n)
            whole, rest = divmod(n, chunk)
            return whole * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2

        return upto(context_len) - upto(first)

    def triangle(lo: int, hi: int) -> int:  # sum of (t + 1) for t in [lo, hi)
        return (hi * (hi + 1) - lo * (lo + 1)) // 2 if hi > lo else 0

    if window is None:
        return triangle(first, context_len)
    split = min(max(window, first), context_len)  # from here on every query sees `window`
    return triangle(first, split) + window * (context_len - split)


def kv_tokens_read(context_len: int, num_query_tokens: int, window: int | None,
                   chunk: int | None = None) -> int:
    """Distinct cached tokens the queries of one sequence read (the union of their windows;
    chunked: from the first query's chunk start on)."""
    if chunk is not None:
        return context_len - (context_len - num_query_tokens) // chunk * chunk
    if window is None:
        return context_len
    return min(context_len, window + num_query_tokens - 1)
