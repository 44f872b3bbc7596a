"""Write the keys and values of new tokens into the paged KV cache.

slot_mapping[t] = block_id * block_size + offset is where token t goes; a negative
slot marks a padding token (for example a CUDA-graph batch padded to a fixed size)
and is skipped.  One program copies one token's keys and values for all KV heads.

A quantized cache (int8 or float8_e4m3fn values, `kernels/kv_quant.py`) comes with its
(num_blocks, block_size, Hkv) float32 scales `k_scales` / `v_scales`: each token's row
of head_dim values per head is quantized on the way in and its scale written beside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._paged_attention import scale_args
from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module
from kernels.kv_quant import QMAX, check_scales, is_quantized, quantize_kv_ref

# Added to and subtracted from a float32 |y| < 2^22, it rounds y to the nearest integer,
# half to even (torch.round's rule), with no rounding function: the same under the
# interpreter and compiled.
_ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23


@triton.jit
def _quantize_rows(x, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    """x (BLOCK_H, BLOCK_D) float32, masked lanes 0 -> (values, scales (BLOCK_H,)); the
    values are rounded and clamped floats, ready for the cache's dtype."""
    scale = tl.div_rn(tl.max(tl.abs(x), 1), QMAX)  # (BLOCK_H,)
    y = tl.div_rn(x, tl.where(scale == 0.0, 1.0, scale)[:, None])
    if IS_INT8:
        y = (y + _ROUND_MAGIC) - _ROUND_MAGIC
    return tl.minimum(tl.maximum(y, -QMAX), QMAX), scale


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    k_scales_ptr, v_scales_ptr,  # quantized caches: (num_blocks, block_size, Hkv) float32
    num_kv_heads, block_size,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kco, stride_kch, stride_kcd,
    stride_vcb, stride_vco, stride_vch, stride_vcd,
    stride_ksb, stride_kso, stride_ksh,
    stride_vsb, stride_vso, stride_vsh,
    HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_INT8: tl.constexpr,
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
                + offs_d[None, :] * stride_kd, mask=mask, other=0.0)
    mask_v = head_mask[:, None] & (offs_dv[None, :] < V_HEAD_DIM)  # (BLOCK_H, BLOCK_DV)
    v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh
                + offs_dv[None, :] * stride_vd, mask=mask_v, other=0.0)
    if QUANT:
        k, k_scale = _quantize_rows(k.to(tl.float32), QMAX, IS_INT8)
        v, v_scale = _quantize_rows(v.to(tl.float32), QMAX, IS_INT8)
        tl.store(k_scales_ptr + block_id * stride_ksb + offset * stride_kso
                 + offs_h * stride_ksh, k_scale, mask=head_mask)
        tl.store(v_scales_ptr + block_id * stride_vsb + offset * stride_vso
                 + offs_h * stride_vsh, v_scale, mask=head_mask)
    tl.store(k_cache_ptr + block_id * stride_kcb + offset * stride_kco
             + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd,
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + block_id * stride_vcb + offset * stride_vco
             + offs_h[:, None] * stride_vch + offs_dv[None, :] * stride_vcd,
             v.to(v_cache_ptr.dtype.element_ty), mask=mask_v)


def _check(key, value, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape[:2] == (num_tokens, num_kv_heads), (key.shape, value.shape)
    assert k_cache.dim() == 4 and k_cache.shape[2:] == (num_kv_heads, head_dim), k_cache.shape
    assert v_cache.shape[:3] == k_cache.shape[:3] and v_cache.shape[3] == value.shape[2]
    assert key.dtype == value.dtype and k_cache.dtype == v_cache.dtype, (key.dtype, k_cache.dtype)
    assert is_quantized(k_cache) or key.dtype == k_cache.dtype, (key.dtype, k_cache.dtype)
    check_scales(k_cache, k_scales, "k_scales")
    check_scales(v_cache, v_scales, "v_scales")
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> None:
    """k_cache/v_cache[slot // block_size, slot % block_size] = key/value[t], in place.

    key: (T, Hkv, D) and value: (T, Hkv, Dv), any strides (views of a fused qkv output
    work); caches: (num_blocks, block_size, Hkv, D|Dv); slot_mapping: (T,) int64.
    Quantized caches (int8 / float8_e4m3fn) take their scales (num_blocks, block_size,
    Hkv) float32 and store each row quantized (`kernels/kv_quant.py`).
    """
    _check(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    v_head_dim = value.shape[2]
    ks, vs, *scale_strides = scale_args(k_scales, v_scales, slot_mapping)
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, ks, vs, num_kv_heads, k_cache.shape[1],
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(), *scale_strides,
        HEAD_DIM=head_dim, V_HEAD_DIM=v_head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_head_dim),
        QUANT=k_scales is not None, QMAX=QMAX.get(k_cache.dtype, 1.0),
        IS_INT8=k_cache.dtype == torch.int8,
    )


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> None:
    """Torch reference (and CPU backend): an index_put into the valid slots."""
    _check(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    rows = [(key, k_cache), (value, v_cache)]
    scales: list[tuple[torch.Tensor, torch.Tensor]] = []
    if k_scales is not None and v_scales is not None:
        kq, ks = quantize_kv_ref(key, k_cache.dtype)  # (T, Hkv, D), (T, Hkv)
        vq, vs = quantize_kv_ref(value, v_cache.dtype)
        rows = [(kq, k_cache), (vq, v_cache)]
        scales = [(ks, k_scales), (vs, v_scales)]
    if slot_mapping.numel() and int(slot_mapping.min()) >= 0:
        # No padding: one index_copy_ per tensor into its (slots, H[, D]) view.
        for src, dst in rows + scales:
            dst.view(-1, *dst.shape[2:]).index_copy_(0, slot_mapping, src)
        return
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block_size = k_cache.shape[1]
    block_ids, offsets = slots // block_size, slots % block_size
    for src, dst in rows + scales:
        dst[block_ids, offsets] = src[valid]


def store_kv_cpu(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> None:
    """C++ CPU kernel (kernels/csrc/store_kv.cpp, the `cpu` backend): row copies, negative
    slots skipped.  An int8 cache goes through kernels/csrc/store_kv_quant.cpp, which
    quantizes each row on the way in."""
    if k_scales is not None and v_scales is not None:
        _check(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)
        cpu_module().store_kv_int8(key, value, k_cache, v_cache, slot_mapping, k_scales,
                                   v_scales)
        return
    cpu_module().store_kv(key, value, k_cache, v_cache, slot_mapping)


def store_kv_cost(
    num_tokens: int, num_kv_heads: int, head_dim: int, v_head_dim: int, dtype_bytes: int,
    cache_bytes: int | None = None, scale_bytes: int = 0,
) -> KernelCost:
    """Each key/value read once (`dtype_bytes`) and written once (`cache_bytes`, default the
    same; a quantized cache also writes one `scale_bytes` scale per row), plus the int64
    slot of each token."""
    cache_bytes = dtype_bytes if cache_bytes is None else cache_bytes
    values = num_tokens * num_kv_heads * (head_dim + v_head_dim)
    scales = num_tokens * num_kv_heads * 2 * scale_bytes
    return KernelCost(flops=0.0, bytes=float(values * (dtype_bytes + cache_bytes) + scales
                                             + 8 * num_tokens))
