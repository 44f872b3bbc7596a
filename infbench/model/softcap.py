"""Attention with Gemma-2's score soft-capping, the path every backend falls back to.

Soft-capping replaces each score s = q.k * scale by cap * tanh(s / cap) before the mask and
the softmax.  No fused kernel of `kernels/` applies it (the Triton and C++ paged attention,
the fused CPU decode layer, SDPA), so a layer whose `LayerSpec.softcap` is set runs these
torch functions instead: `DenseContext` for references, the engine's paged context
(`engine/runner.py`) on every backend.  They are plain fp32 matmuls, slower than the
kernels but exact, never a silently uncapped softmax.
"""

from __future__ import annotations

import torch

from kernels._paged_attention import dequantized_rows, gather_kv_ref


def softcap(values: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(values / cap): Gemma-2's soft-capping of attention scores and logits."""
    return torch.tanh(values / cap) * cap


def softcapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    window: int | None,
    cap: float,
) -> torch.Tensor:
    """One sequence: q (Q, Hq, D) at positions q_pos (Q,) over keys k (Hkv, L, D) at 0..L-1,
    values v (Hkv, L, Dv); key p is visible to query t iff p <= t and t - p < window.
    Returns (Q, Hq, Dv) in q.dtype."""
    num_q, num_heads, head_dim = q.shape
    num_kv_heads, num_keys = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    qg = q.float().view(num_q, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # (Hkv,G,Q,D)
    scores = softcap(qg @ k.float()[:, None].transpose(-1, -2) * scale, cap)  # (Hkv, G, Q, L)
    delta = q_pos[:, None] - torch.arange(num_keys, device=q.device)  # (Q, L)
    visible = delta >= 0
    if window is not None:
        visible &= delta < window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a query seeing no key: zeros
    out = probs @ v.float()[:, None]  # (Hkv, G, Q, Dv)
    return out.permute(2, 0, 1, 3).reshape(num_q, num_heads, -1).to(q.dtype)  # (Q, Hq, Dv)


def paged_softcapped_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: list[int],
    context_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    window: int | None,
    cap: float,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Soft-capped attention over the paged cache: sequence b's queries q[cu[b]:cu[b+1]]
    are the last ones of its context_lens[b] cached tokens (block table row b).  A decode
    row is a sequence of one query.  q (T, Hq, D) -> (T, Hq, Dv)."""
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])  # (T, Hq, Dv)
    for b, context_len in enumerate(context_lens):
        start, end = cu_seqlens_q[b], cu_seqlens_q[b + 1]
        if end == start:
            continue
        keys = gather_kv_ref(k_cache, block_tables[b], context_len)  # (Hkv, L, D)
        values = gather_kv_ref(v_cache, block_tables[b], context_len)  # (Hkv, L, Dv)
        if k_scales is not None and v_scales is not None:  # a quantized cache's rows
            keys = dequantized_rows(keys, gather_kv_ref(
                k_scales.unsqueeze(-1), block_tables[b], context_len)[..., 0])
            values = dequantized_rows(values, gather_kv_ref(
                v_scales.unsqueeze(-1), block_tables[b], context_len)[..., 0])
        q_pos = torch.arange(context_len - (end - start), context_len, device=q.device)
        out[start:end] = softcapped_attention(q[start:end], keys, values, q_pos, scale,
                                              window, cap)
    return out
