"""Rotary position embedding, rotate-half layout (GPT-NeoX / HF Llama), in place.

Dimension i < rot_dim / 2 pairs with i + rot_dim / 2:
    x1' = x1 * cos - x2 * sin,   x2' = x2 * cos + x1 * sin.
cos_sin_cache: (max_position, rot_dim), cos in the first half and sin in the second
(vLLM's format; the model builds it, rope scaling included).  Only the first
rotary_dim dims rotate (partial rotary); the rest pass through.  q and k may be
strided views, for example slices of a fused qkv projection output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module


@triton.jit
def _rotate_heads(
    x_ptr, stride_t, stride_h, stride_d, token, num_heads, cos, sin, offs_half, half_mask,
    BLOCK_H: tl.constexpr, HALF: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h[:, None] < num_heads) & half_mask[None, :]  # (BLOCK_H, BLOCK_HALF)
    ptrs = x_ptr + token * stride_t + offs_h[:, None] * stride_h + offs_half[None, :] * stride_d
    x1 = tl.load(ptrs, mask=mask, other=0.0)
    x2 = tl.load(ptrs + HALF * stride_d, mask=mask, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    tl.store(ptrs, x1f * cos[None, :] - x2f * sin[None, :], mask=mask)
    tl.store(ptrs + HALF * stride_d, x2f * cos[None, :] + x1f * sin[None, :], mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, positions_ptr, cos_sin_ptr, num_q_heads, num_kv_heads,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_cache,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    token = tl.program_id(0)
    pos = tl.load(positions_ptr + token)
    offs_half = tl.arange(0, BLOCK_HALF)
    half_mask = offs_half < HALF
    row = cos_sin_ptr + pos * stride_cache
    cos = tl.load(row + offs_half, mask=half_mask, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + offs_half, mask=half_mask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, stride_qd, token, num_q_heads, cos, sin,
                  offs_half, half_mask, BLOCK_HQ, HALF)
    _rotate_heads(k_ptr, stride_kt, stride_kh, stride_kd, token, num_kv_heads, cos, sin,
                  offs_half, half_mask, BLOCK_HK, HALF)


def _rot_dim(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
             rotary_dim: int | None) -> int:
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0], (q.shape, k.shape)
    assert q.shape[2] == k.shape[2], "q and k must share the head dim"
    rot_dim = q.shape[2] if rotary_dim is None else rotary_dim
    assert rot_dim % 2 == 0 and 0 < rot_dim <= q.shape[2], f"bad rotary_dim {rot_dim}"
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == rot_dim, cos_sin_cache.shape
    return rot_dim


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (T, Hq, D) and k (T, Hkv, D) in place at positions (T,) int64; returns (q, k)."""
    rot_dim = _rot_dim(q, k, cos_sin_cache, rotary_dim)
    assert positions.shape == (q.shape[0],) and positions.dtype == torch.int64
    assert cos_sin_cache.stride(1) == 1, "cos_sin_cache rows must be contiguous"
    if q.shape[0] == 0:
        return q, k
    half = rot_dim // 2
    _rope_kernel[(q.shape[0],)](
        q, k, positions, cos_sin_cache, q.shape[1], k.shape[1],
        *q.stride(), *k.stride(), cos_sin_cache.stride(0),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(q.shape[1]), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
    )
    return q, k


def rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (and CPU backend): the same rotation in fp32, written back in place."""
    rot_dim = _rot_dim(q, k, cos_sin_cache, rotary_dim)
    half = rot_dim // 2
    cos_sin = cos_sin_cache[positions].float()  # (T, rot_dim)
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # (T, 1, half)
    for x in (q, k):
        # Copies: .float() of a float32 view aliases x, which the first write would clobber.
        x1 = x[..., :half].to(torch.float32, copy=True)
        x2 = x[..., half:rot_dim].to(torch.float32, copy=True)
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half:rot_dim] = x2 * cos + x1 * sin
    return q, k


def rope_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """C++ CPU kernel (kernels/csrc/rope.cpp, the `cpu` backend): in place on the strided
    q/k views, fp32 math; returns (q, k)."""
    cpu_module().rope(q, k, positions, cos_sin_cache, rotary_dim)
    return q, k


def rope_cost(
    num_tokens: int, num_q_heads: int, num_kv_heads: int, rotary_dim: int, dtype_bytes: int,
    cache_dtype_bytes: int = 4,
) -> KernelCost:
    """Read and write the rotated dims of q and k, read one cos/sin row per token; 3 FLOPs/elem."""
    elems = num_tokens * (num_q_heads + num_kv_heads) * rotary_dim
    bytes_moved = 2 * elems * dtype_bytes + num_tokens * (rotary_dim * cache_dtype_bytes + 8)
    return KernelCost(flops=3.0 * elems, bytes=float(bytes_moved))
