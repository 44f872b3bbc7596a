"""Recurrent (decode) step of the Mamba-1 selective scan over per-sequence state slots.

For each sequence b, channel c and state index n, with h the state in slot `slots[b]`:

    dt = softplus(dt_raw + dt_bias)                 (B, C)
    h  <- exp(dt * A) * h + dt * B[n] * x           (C, N)
    y  = (sum_n C[n] * h[:, n] + D * x) * silu(z)

as transformers' `mamba_selective_state_update` and mamba_ssm's
`selective_state_update` compute it.  One program owns one sequence and a tile of
BLOCK_C channels with the whole state dimension, so every state element is read
and written once and no two programs touch the same slot rows.  Math in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cdiv, next_pow2
from kernels.cost import KernelCost

# torch.nn.functional.softplus's default threshold: above it softplus(x) is x.
SOFTPLUS_THRESHOLD = 20.0


@triton.jit
def _selective_state_update_kernel(
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, z_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    d_inner, d_state,
    stride_xb, stride_xc, stride_dtb, stride_dtc, stride_ac, stride_an,
    stride_bb, stride_bn, stride_cb, stride_cn, stride_zb, stride_zc,
    stride_sn, stride_sc, stride_ss, stride_ob, stride_oc,
    THRESHOLD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_n = tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + b)
    is_valid = slot >= 0
    slot = tl.where(is_valid, slot, 0)
    mask_c = offs_c < tl.where(is_valid, d_inner, 0)
    mask_n = offs_n < d_state
    mask = mask_c[:, None] & mask_n[None, :]  # (BLOCK_C, BLOCK_N)

    x = tl.load(x_ptr + b * stride_xb + offs_c * stride_xc, mask=mask_c, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * stride_dtb + offs_c * stride_dtc, mask=mask_c,
                 other=0.0).to(tl.float32)
    dt += tl.load(dt_bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    dt = tl.where(dt > THRESHOLD, dt, tl.log(1.0 + tl.exp(tl.minimum(dt, THRESHOLD))))
    a = tl.load(a_ptr + offs_c[:, None] * stride_ac + offs_n[None, :] * stride_an, mask=mask,
                other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + b * stride_bb + offs_n * stride_bn, mask=mask_n, other=0.0).to(tl.float32)
    cc = tl.load(c_ptr + b * stride_cb + offs_n * stride_cn, mask=mask_n, other=0.0).to(tl.float32)
    s_ptrs = (state_ptr + slot * stride_sn + offs_c[:, None] * stride_sc
              + offs_n[None, :] * stride_ss)
    h = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_C, BLOCK_N)
    h = h * tl.exp(dt[:, None] * a) + (dt[:, None] * bb[None, :]) * x[:, None]
    tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=mask)

    y = tl.sum(h * cc[None, :], axis=1)  # (BLOCK_C,)
    y += x * tl.load(d_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + b * stride_zb + offs_c * stride_zc, mask=mask_c, other=0.0).to(tl.float32)
    y = y * (z * tl.sigmoid(z))
    tl.store(out_ptr + b * stride_ob + offs_c * stride_oc, y.to(out_ptr.dtype.element_ty),
             mask=offs_c < d_inner)


def _check(x, dt, a, b, c, d, z, dt_bias, state, slots) -> None:
    batch, d_inner = x.shape
    d_state = a.shape[1]
    assert dt.shape == z.shape == x.shape, (x.shape, dt.shape, z.shape)
    assert a.shape == (d_inner, d_state) and d.shape == dt_bias.shape == (d_inner,)
    assert b.shape == c.shape == (batch, d_state), (b.shape, c.shape)
    assert state.dim() == 3 and state.shape[1:] == (d_inner, d_state), state.shape
    assert slots.shape == (batch,) and slots.dtype == torch.int64, (slots.shape, slots.dtype)


def selective_state_update(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    z: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One scan step for B sequences; updates `state` in place.

    x, dt (before bias and softplus), z: (B, d_inner); a = -exp(A_log): (d_inner, d_state);
    b, c: (B, d_state); d, dt_bias: (d_inner,); state: (num_slots, d_inner, d_state);
    slots: (B,) int64.  Returns y (B, d_inner) in x's dtype.
    """
    _check(x, dt, a, b, c, d, z, dt_bias, state, slots)
    batch, d_inner = x.shape
    d_state = a.shape[1]
    out = torch.zeros_like(x)  # (B, d_inner)
    if batch == 0:
        return out
    block_n = next_pow2(d_state)
    block_c = max(1, min(64, 4096 // block_n, next_pow2(d_inner)))
    _selective_state_update_kernel[(batch, cdiv(d_inner, block_c))](
        x, dt, a, b, c, d, z, dt_bias, state, slots, out, d_inner, d_state,
        *x.stride(), *dt.stride(), *a.stride(), *b.stride(), *c.stride(), *z.stride(),
        *state.stride(), *out.stride(),
        THRESHOLD=SOFTPLUS_THRESHOLD, BLOCK_C=block_c, BLOCK_N=block_n,
    )
    return out


def selective_state_update_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    z: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Torch reference (and CPU backend), in transformers' order of operations."""
    _check(x, dt, a, b, c, d, z, dt_bias, state, slots)
    valid = slots >= 0
    idx = slots[valid]
    xv = x[valid].float()  # (b, C)
    step = F.softplus(dt[valid].float() + dt_bias.float())  # (b, C)
    decay = torch.exp(step[..., None] * a.float())  # (b, C, N)
    h = state[idx].float() * decay + step[..., None] * b[valid].float()[:, None, :] * xv[..., None]
    state[idx] = h.to(state.dtype)
    y = (h @ c[valid].float()[..., None]).squeeze(-1) + xv * d.float()  # (b, C)
    out = torch.zeros_like(x)
    out[valid] = (y * F.silu(z[valid].float())).to(x.dtype)
    return out


def selective_state_update_cost(
    batch: int, d_inner: int, d_state: int, dtype_bytes: int, state_bytes: int
) -> KernelCost:
    """About 7 FLOPs per (channel, state) for discretize, update and read-out, plus the
    skip and gate per channel; the state is read and written once, A (float32), D and
    dt_bias read once, x, dt, z, B, C read and y written once per sequence."""
    flops = batch * (7 * d_inner * d_state + 8 * d_inner)
    io = batch * (4 * d_inner + 2 * d_state) * dtype_bytes + 8 * batch
    params = d_inner * d_state * 4 + 2 * d_inner * dtype_bytes
    return KernelCost(flops=float(flops),
                      bytes=float(2 * batch * d_inner * d_state * state_bytes + io + params))
