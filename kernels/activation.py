"""SwiGLU activation: silu(gate) * up for the fused gate_up projection output.

x is (T, 2I) with the gate in the first I columns and the up projection in the last I
(the vLLM / HF LlamaMLP layout when gate_proj and up_proj are fused).  Computed in
fp32 and rounded once to x.dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cdiv
from kernels.cost import KernelCost
from kernels.cpu_ops import module as cpu_module


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, num_tokens, inter_size,
    stride_xt, stride_xi, stride_ot, stride_oi,
    BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (offs_t[:, None] < num_tokens) & (offs_i[None, :] < inter_size)  # (BLOCK_T, BLOCK_I)
    row = x_ptr + offs_t[:, None] * stride_xt
    gate = tl.load(row + offs_i[None, :] * stride_xi, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + (offs_i[None, :] + inter_size) * stride_xi, mask=mask, other=0.0)
    out = gate * tl.sigmoid(gate) * up.to(tl.float32)
    tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_i[None, :] * stride_oi, out, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x: (T, 2I); returns (T, I) in x.dtype."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be (T, 2I), got {tuple(x.shape)}"
    num_tokens, inter_size = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, inter_size, dtype=x.dtype, device=x.device)  # (T, I)
    if num_tokens == 0:
        return out
    block_i = min(1024, triton.next_power_of_2(inter_size))
    block_t = max(1, min(16, 4096 // block_i, triton.next_power_of_2(num_tokens)))
    grid = (cdiv(num_tokens, block_t), cdiv(inter_size, block_i))
    _silu_and_mul_kernel[grid](
        x, out, num_tokens, inter_size, *x.stride(), *out.stride(),
        BLOCK_T=block_t, BLOCK_I=block_i,
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference (and CPU backend), computed in fp32 like the kernel."""
    inter_size = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :inter_size]) * xf[..., inter_size:]).to(x.dtype)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """C++ CPU kernel (kernels/csrc/activation.cpp, the `cpu` backend), fp32 math."""
    return cpu_module().silu_and_mul(x)  # type: ignore[no-any-return]


def silu_and_mul_cost(num_tokens: int, inter_size: int, dtype_bytes: int) -> KernelCost:
    """Read 2I, write I per token; about 5 FLOPs per output (exp, add, div, 2 mul)."""
    return KernelCost(
        flops=5.0 * num_tokens * inter_size,
        bytes=float(3 * num_tokens * inter_size * dtype_bytes),
    )
