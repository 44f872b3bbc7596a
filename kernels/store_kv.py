"""Write the keys and values of new tokens into the paged KV cache.

slot_mapping[t] = block_id * block_size + offset is where token t goes; a negative
slot marks a padding token (for example a CUDA-graph batch padded to a fixed size)
and is skipped.  One program copies one token's keys and values for all KV heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    num_kv_heads, block_size,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kco, stride_kch, stride_kcd,
    stride_vcb, stride_vco, stride_vch, stride_vcd,
    HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    is_valid = slot >= 0
    block_id = tl.where(is_valid, slot // block_size, 0)
    offset = tl.where(is_valid, slot % block_size, 0)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    head_mask = offs_h < tl.where(is_valid, num_kv_heads, 0)  # padding tokens store nothing

    mask = head_mask[:, None] & (offs_d[None, :] < HEAD_DIM)  # (BLOCK_H, BLOCK_D)
    k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh
                + offs_d[None, :] * stride_kd, mask=mask)
    tl.store(k_cache_ptr + block_id * stride_kcb + offset * stride_kco
             + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd, k, mask=mask)

    mask_v = head_mask[:, None] & (offs_dv[None, :] < V_HEAD_DIM)  # (BLOCK_H, BLOCK_DV)
    v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh
                + offs_dv[None, :] * stride_vd, mask=mask_v)
    tl.store(v_cache_ptr + block_id * stride_vcb + offset * stride_vco
             + offs_h[:, None] * stride_vch + offs_dv[None, :] * stride_vcd, v, mask=mask_v)


def _check(key, value, k_cache, v_cache, slot_mapping) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape[:2] == (num_tokens, num_kv_heads), (key.shape, value.shape)
    assert k_cache.dim() == 4 and k_cache.shape[2:] == (num_kv_heads, head_dim), k_cache.shape
    assert v_cache.shape[:3] == k_cache.shape[:3] and v_cache.shape[3] == value.shape[2]
    assert key.dtype == value.dtype == k_cache.dtype == v_cache.dtype, (key.dtype, k_cache.dtype)
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k_cache/v_cache[slot // block_size, slot % block_size] = key/value[t], in place.

    key: (T, Hkv, D) and value: (T, Hkv, Dv), any strides (views of a fused qkv output
    work); caches: (num_blocks, block_size, Hkv, D|Dv); slot_mapping: (T,) int64.
    """
    _check(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    v_head_dim = value.shape[2]
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, num_kv_heads, k_cache.shape[1],
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        HEAD_DIM=head_dim, V_HEAD_DIM=v_head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
    )


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Torch reference (and CPU backend): an index_put into the valid slots."""
    _check(key, value, k_cache, v_cache, slot_mapping)
    if slot_mapping.numel() and int(slot_mapping.min()) >= 0:
        # No padding: one index_copy_ per cache into its (slots, H, D) view.
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)
        return
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block_size = k_cache.shape[1]
    block_ids, offsets = slots // block_size, slots % block_size
    k_cache[block_ids, offsets] = key[valid]
    v_cache[block_ids, offsets] = value[valid]


def store_kv_cpu(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """C++ CPU kernel (kernels/csrc/store_kv.cpp, the `cpu` backend): row copies, negative
    slots skipped."""
    cpu_module().store_kv(key, value, k_cache, v_cache, slot_mapping)


def store_kv_cost(
    num_tokens: int, num_kv_heads: int, head_dim: int, v_head_dim: int, dtype_bytes: int
) -> KernelCost:
    """Each key/value read once and written once, plus the int64 slot of each token."""
    kv = num_tokens * num_kv_heads * (head_dim + v_head_dim) * dtype_bytes
    return KernelCost(flops=0.0, bytes=float(2 * kv + 8 * num_tokens))
