"""RMSNorm with an optional fused residual add (HF LlamaRMSNorm semantics).

out = weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype) with h = x in fp32.  With a
residual, new_residual = x + residual (rounded to x.dtype, as the model adds in its
dtype) is normalised instead and returned next to the output, which saves one pass
over the hidden states per layer.  Inputs are never modified.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv
from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module


@triton.jit
def _rmsnorm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    num_tokens, hidden_size, eps,
    stride_xt, stride_rt, stride_ot, stride_nt,
    HAS_RESIDUAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    col_mask = offs_h < hidden_size
    mask = (offs_t[:, None] < num_tokens) & col_mask[None, :]  # (BLOCK_T, BLOCK_H)
    x = tl.load(x_ptr + offs_t[:, None] * stride_xt + offs_h[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + offs_t[:, None] * stride_rt + offs_h[None, :],
                    mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the model adds in its dtype
        tl.store(new_residual_ptr + offs_t[:, None] * stride_nt + offs_h[None, :], x, mask=mask)
    h = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h * h, 1) / hidden_size + eps)  # (BLOCK_T,)
    normed = (h * inv_rms[:, None]).to(x.dtype).to(tl.float32)  # HF casts back before weight
    w = tl.load(weight_ptr + offs_h, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_h[None, :], normed * w[None, :],
             mask=mask)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x (T, H) scaled by weight (H,); with residual returns (out, x + residual)."""
    assert x.dim() == 2 and weight.shape == (x.shape[1],), (x.shape, weight.shape)
    assert x.stride(1) == 1, "rows of x must be contiguous"
    num_tokens, hidden_size = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # (T, H)
    new_residual = out
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1, residual.shape
        new_residual = torch.empty_like(out)  # (T, H)
    if num_tokens:
        block_h = triton.next_power_of_2(hidden_size)
        block_t = max(1, min(16, 8192 // block_h, triton.next_power_of_2(num_tokens)))
        res = residual if residual is not None else x
        _rmsnorm_kernel[(cdiv(num_tokens, block_t),)](
            x, res, weight, out, new_residual, num_tokens, hidden_size, eps,
            x.stride(0), res.stride(0), out.stride(0), new_residual.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK_T=block_t, BLOCK_H=block_h,
            num_warps=min(16, max(1, block_h // 256)),
        )
    return out if residual is None else (out, new_residual)


def rmsnorm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (and CPU backend), line for line HF LlamaRMSNorm."""
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * h.to(x.dtype)).to(x.dtype)
    return out if residual is None else (out, x)


def rmsnorm_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """C++ CPU kernel (kernels/csrc/norm.cpp, the `cpu` backend), rounded as the reference."""
    return cpu_module().rmsnorm(x, weight, eps, residual)  # type: ignore[no-any-return]


def rmsnorm_cost(
    num_tokens: int, hidden_size: int, dtype_bytes: int, has_residual: bool = False
) -> KernelCost:
    """Read x (+ residual) and the weight, write out (+ new residual); ~4 FLOPs per element."""
    passes = 4 if has_residual else 2
    flops = (5.0 if has_residual else 4.0) * num_tokens * hidden_size
    bytes_moved = (passes * num_tokens + 1) * hidden_size * dtype_bytes
    return KernelCost(flops=flops, bytes=float(bytes_moved))
