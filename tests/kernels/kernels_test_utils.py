"""Builders shared by the kernel tests: random paged KV caches and tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}


@dataclass(frozen=True)
class PagedKV:
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor  # (num_blocks, block_size, Hkv, Dv)
    block_tables: torch.Tensor  # (B, max_blocks) int32
    context_lens: torch.Tensor  # (B,) int32
    keys: list[torch.Tensor]  # per sequence (ctx, Hkv, D), contiguous
    values: list[torch.Tensor]  # per sequence (ctx, Hkv, Dv)


def make_paged_kv(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int | None = None,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> PagedKV:
    """A cache whose blocks are shuffled across sequences; unused slots hold NaN.

    A kernel that reads a slot it must not (past a context end, an unused block) turns
    its output into NaN, so masking bugs cannot hide behind small values.
    """
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in context_lens]
    max_blocks = max(needed + [1]) + 1  # one column of 0-padding past the longest sequence
    num_blocks = sum(needed) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                         dtype=dtype)
    v_cache = torch.full((num_blocks, block_size, num_kv_heads, v_head_dim), float("nan"),
                         dtype=dtype)
    block_tables = torch.zeros(len(context_lens), max_blocks, dtype=torch.int32)
    keys, values, used = [], [], 0
    for b, n in enumerate(context_lens):
        ids = perm[used:used + needed[b]]
        used += needed[b]
        block_tables[b, : needed[b]] = ids.int()
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, v_head_dim, generator=gen).to(dtype)
        pos = torch.arange(n)
        k_cache[ids.long()[pos // block_size], pos % block_size] = k
        v_cache[ids.long()[pos // block_size], pos % block_size] = v
        keys.append(k)
        values.append(v)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return PagedKV(k_cache, v_cache, block_tables, lens, keys, values)


def naive_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense attention of the last Q positions of one sequence, one head at a time.

    q: (Q, Hq, D); k: (L, Hkv, D); v: (L, Hkv, Dv) -> (Q, Hq, Dv) in fp32.  sinks (Hq,):
    gpt-oss's extra logit per head, a softmax column whose value is zero.
    """
    num_q, num_heads, _ = q.shape
    num_keys, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    out = torch.empty(num_q, num_heads, v.shape[-1])
    mask = torch.zeros(num_q, num_keys, dtype=torch.bool)
    for i in range(num_q):
        t = num_keys - num_q + i
        for p in range(num_keys):
            mask[i, p] = p <= t and (window is None or t - p < window)
    for h in range(num_heads):
        scores = q[:, h].double() @ k[:, h // group].double().T * scale  # (Q, L)
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:  # the sink's column joins the softmax, then is dropped
            sink = torch.full((num_q, 1), float(sinks[h]), dtype=torch.float64)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[:, :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[:, h] = (probs @ v[:, h // group].double()).float()
    return out
