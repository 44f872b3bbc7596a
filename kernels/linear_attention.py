"""Recurrent (decode) step of causal linear attention over per-sequence state slots.

For each sequence b and head h, with the state (S, z) in slot `slots[b]`:

    S <- S + phi(k) v^T        (f, d)
    z <- z + phi(k)            (f,)
    out = phi(q)^T S / (phi(q)^T z + eps)

q_feat / k_feat are the already feature-mapped phi(q), phi(k) (the map is the
model's business).  One program owns one (sequence, head) pair and walks the
feature dimension in BLOCK_F tiles, so it reads and writes each state element
exactly once and never races with another program; the numerator accumulates
in float32 whatever the state dtype.  A negative slot (padding) writes nothing
and returns zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, next_pow2
from kernels.cost import KernelCost


@triton.jit
def _linear_attention_decode_kernel(
    q_ptr, k_ptr, v_ptr, s_ptr, z_ptr, slots_ptr, out_ptr,
    feat_dim, head_dim, eps,
    stride_qb, stride_qh, stride_qf,
    stride_kb, stride_kh, stride_kf,
    stride_vb, stride_vh, stride_vd,
    stride_sn, stride_sh, stride_sf, stride_sd,
    stride_zn, stride_zh, stride_zf,
    stride_ob, stride_oh, stride_od,
    NUM_F_BLOCKS: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slots_ptr + b)
    is_valid = slot >= 0
    slot = tl.where(is_valid, slot, 0)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < tl.where(is_valid, head_dim, 0)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_d * stride_vd, mask=mask_d,
                other=0.0).to(tl.float32)  # (BLOCK_D,)
    num = tl.zeros([BLOCK_D], dtype=tl.float32)
    den = tl.zeros([BLOCK_F], dtype=tl.float32)
    s_base = s_ptr + slot * stride_sn + h * stride_sh
    z_base = z_ptr + slot * stride_zn + h * stride_zh
    for i in range(NUM_F_BLOCKS):
        offs_f = i * BLOCK_F + tl.arange(0, BLOCK_F)
        mask_f = offs_f < tl.where(is_valid, feat_dim, 0)
        q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_f * stride_qf, mask=mask_f,
                    other=0.0).to(tl.float32)  # (BLOCK_F,)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_f * stride_kf, mask=mask_f,
                    other=0.0).to(tl.float32)
        s_ptrs = s_base + offs_f[:, None] * stride_sf + offs_d[None, :] * stride_sd
        mask_s = mask_f[:, None] & mask_d[None, :]
        s = tl.load(s_ptrs, mask=mask_s, other=0.0).to(tl.float32)  # (BLOCK_F, BLOCK_D)
        s = s + k[:, None] * v[None, :]
        tl.store(s_ptrs, s.to(s_ptr.dtype.element_ty), mask=mask_s)
        num += tl.sum(q[:, None] * s, axis=0)
        z = tl.load(z_base + offs_f * stride_zf, mask=mask_f, other=0.0).to(tl.float32)
        z = z + k
        tl.store(z_base + offs_f * stride_zf, z.to(z_ptr.dtype.element_ty), mask=mask_f)
        den += q * z
    out = num / (tl.sum(den, axis=0) + eps)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


def _check(q_feat, k_feat, v, state_s, state_z, slots) -> None:
    batch, heads, feat = q_feat.shape
    assert k_feat.shape == q_feat.shape, (q_feat.shape, k_feat.shape)
    assert v.dim() == 3 and v.shape[:2] == (batch, heads), v.shape
    assert state_s.dim() == 4 and state_s.shape[1:] == (heads, feat, v.shape[2]), state_s.shape
    assert state_z.shape == (state_s.shape[0], heads, feat), state_z.shape
    assert q_feat.dtype == k_feat.dtype == v.dtype, (q_feat.dtype, k_feat.dtype, v.dtype)
    assert state_s.dtype == state_z.dtype, (state_s.dtype, state_z.dtype)
    assert slots.shape == (batch,) and slots.dtype == torch.int64, (slots.shape, slots.dtype)


def linear_attention_decode(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    state_s: torch.Tensor,
    state_z: torch.Tensor,
    slots: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One recurrent step for B sequences; updates state_s / state_z in place.

    q_feat, k_feat: (B, H, f); v: (B, H, d); state_s: (num_slots, H, f, d);
    state_z: (num_slots, H, f); slots: (B,) int64.  Returns (B, H, d) in v's dtype.
    """
    _check(q_feat, k_feat, v, state_s, state_z, slots)
    batch, heads, feat = q_feat.shape
    head_dim = v.shape[2]
    out = torch.zeros(batch, heads, head_dim, dtype=v.dtype, device=v.device)  # (B, H, d)
    if batch == 0:
        return out
    block_f = min(32, next_pow2(feat))
    _linear_attention_decode_kernel[(batch, heads)](
        q_feat, k_feat, v, state_s, state_z, slots, out, feat, head_dim, eps,
        *q_feat.stride(), *k_feat.stride(), *v.stride(), *state_s.stride(), *state_z.stride(),
        *out.stride(),
        NUM_F_BLOCKS=cdiv(feat, block_f), BLOCK_F=block_f, BLOCK_D=next_pow2(head_dim),
    )
    return out


def linear_attention_decode_ref(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    state_s: torch.Tensor,
    state_z: torch.Tensor,
    slots: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Torch reference (and CPU backend) of `linear_attention_decode`, float32 math."""
    _check(q_feat, k_feat, v, state_s, state_z, slots)
    valid = slots >= 0
    idx = slots[valid]
    q, k, vv = q_feat[valid].float(), k_feat[valid].float(), v[valid].float()
    s = state_s[idx].float() + k[..., :, None] * vv[..., None, :]  # (b, H, f, d)
    z = state_z[idx].float() + k  # (b, H, f)
    state_s[idx] = s.to(state_s.dtype)
    state_z[idx] = z.to(state_z.dtype)
    num = torch.einsum("bhf,bhfd->bhd", q, s)
    den = (q * z).sum(-1, keepdim=True)  # (b, H, 1)
    out = torch.zeros_like(v)
    out[valid] = (num / (den + eps)).to(v.dtype)
    return out


def linear_attention_decode_cost(
    batch: int, heads: int, feat_dim: int, head_dim: int, dtype_bytes: int, state_bytes: int
) -> KernelCost:
    """State read and written once; q, k, v read and the output written once per head."""
    per_head_flops = 4 * feat_dim * head_dim + 3 * feat_dim + head_dim  # update, q.S, z, q.z, /
    state = feat_dim * head_dim + feat_dim
    io = 2 * feat_dim + 2 * head_dim
    return KernelCost(
        flops=float(batch * heads * per_head_flops),
        bytes=float(batch * (heads * (2 * state * state_bytes + io * dtype_bytes) + 8)),
    )
