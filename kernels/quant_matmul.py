"""Weight-only quantized matmul: y = x @ dequant(W)^T with int8 or int4 weights.

int8: symmetric per output channel, W[n, k] ~= q[n, k] * scale[n].
int4: asymmetric per group of `group_size` input columns,
      W[n, k] ~= (q[n, k] - zero[n, g]) * scale[n, g] with g = k // group_size, q in 0..15;
      two values per byte: byte k // 2 holds column k in its low nibble when k is even
      and in its high nibble when k is odd.  Scales and integer-valued zero points are
      stored in the weight's float dtype (2 x 16 bits per group in half precision).

Weights are dequantized inside the kernels, tile by tile, so only the packed bytes
cross the memory bus.  Two kernels share the dequantization:
- GEMV (M <= 8, decode): split over N and K, multiply-and-sum on CUDA cores (no tl.dot:
  a 16-row MMA tile would be mostly padding); with split-K the partial sums land in an
  fp32 workspace that is summed afterwards.
- GEMM (prefill): tiles (BLOCK_M, BLOCK_N) with tl.dot over BLOCK_K steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, dot_precision, is_compiled, num_compute_units
from kernels.cost import KernelCost

GEMV_MAX_M = 8


@triton.jit
def _dequant_tile(
    w_ptr, scale_ptr, zero_ptr, offs_n, k0, N, K, group_size,
    stride_wn, stride_wk, stride_sn, stride_sg,
    BITS: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Dequantized weights W[offs_n, k0:k0+BLOCK_K] as fp32 (BLOCK_N, BLOCK_K).

    BLOCK_K divides group_size and k0 is a multiple of BLOCK_K, so the tile sits in one group.
    """
    offs_k = k0 + tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    mask = n_mask[:, None] & (offs_k[None, :] < K)
    if BITS == 8:
        q = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                    mask=mask, other=0).to(tl.float32)
        scale = tl.load(scale_ptr + offs_n * stride_sn, mask=n_mask, other=0.0).to(tl.float32)
        w = q * scale[:, None]
    else:
        byte = tl.load(w_ptr + offs_n[:, None] * stride_wn + (offs_k[None, :] // 2) * stride_wk,
                       mask=mask, other=0).to(tl.int32)
        q = ((byte >> ((offs_k[None, :] % 2) * 4)) & 0xF).to(tl.float32)
        group = k0 // group_size
        s_off = offs_n * stride_sn + group * stride_sg
        scale = tl.load(scale_ptr + s_off, mask=n_mask, other=0.0).to(tl.float32)
        zero = tl.load(zero_ptr + s_off, mask=n_mask, other=0.0).to(tl.float32)
        w = (q - zero[:, None]) * scale[:, None]
    return w


@triton.jit
def _quant_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, out_ptr, M, N, K, group_size, k_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg,
    stride_os, stride_om, stride_on,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        w = _dequant_tile(w_ptr, scale_ptr, zero_ptr, offs_n, k0, N, K, group_size,
                          stride_wn, stride_wk, stride_sn, stride_sg, BITS, BLOCK_K)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        # (BLOCK_M, 1, BLOCK_K) * (1, BLOCK_N, BLOCK_K) summed over K -> (BLOCK_M, BLOCK_N)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], 2)
    o_ptrs = out_ptr + split * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _quant_gemm_kernel(
    x_ptr, w_ptr, scale_ptr, zero_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_om, stride_on,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w = _dequant_tile(w_ptr, scale_ptr, zero_ptr, offs_n, k0, N, K, group_size,
                          stride_wn, stride_wk, stride_sn, stride_sg, BITS, BLOCK_K)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
            n: int, group_size: int, bits: int, split_k: int | None) -> torch.Tensor:
    m, k = x.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)  # (M, N)
    if m == 0 or n == 0:
        return out
    compiled = is_compiled(x)
    # int4 tiles must not straddle a group; int8 has one scale per row, any tile works.
    block_k = min(group_size if bits == 4 else triton.next_power_of_2(k), 128)
    if compiled:  # the GEMV's 3-D (M, N, K) product lives in registers: keep it small
        block_k = min(block_k, 64 if m <= 2 else 32)
    s_strides = (scales.stride(0), scales.stride(1) if scales.dim() == 2 else 0)
    if m <= GEMV_MAX_M:
        block_n = 32 if compiled else 64
        num_n = cdiv(n, block_n)
        k_tiles = cdiv(k, block_k)
        if split_k is None:  # fill ~2 waves of programs, at least 4 K-tiles per split
            split_k = max(1, min(cdiv(2 * num_compute_units(x.device), num_n), k_tiles // 4))
        split_k = max(1, min(split_k, k_tiles))
        k_per_split = cdiv(k_tiles, split_k) * block_k
        split_k = cdiv(k, k_per_split)  # drop splits that would be empty
        dest = out if split_k == 1 else torch.empty(  # (S, M, N) fp32 partial sums
            split_k, m, n, dtype=torch.float32, device=x.device)
        d_strides = (0, *out.stride()) if split_k == 1 else dest.stride()
        _quant_gemv_kernel[(num_n, split_k)](
            x, w, scales, zeros, dest, m, n, k, group_size, k_per_split,
            *x.stride(), *w.stride(), *s_strides, *d_strides,
            BITS=bits, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k,
        )
        if split_k > 1:
            out.copy_(dest.sum(0))
        return out
    block_m = 64 if compiled or m >= 64 else max(16, triton.next_power_of_2(m))
    block_n = 64
    _quant_gemm_kernel[(cdiv(m, block_m), cdiv(n, block_n))](
        x, w, scales, zeros, out, m, n, k, group_size,
        *x.stride(), *w.stride(), *s_strides, *out.stride(),
        BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION=dot_precision(x.dtype),
    )
    return out


# ---------------------------------------------------------------------------------- int8
def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (qweight (N, K) int8, scales (N,) in w.dtype)."""
    assert w.dim() == 2, w.shape
    wf = w.float()
    scales = (wf.abs().amax(dim=1) / 127.0).clamp(min=1e-8).to(w.dtype)  # (N,)
    qweight = torch.round(wf / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return qweight, scales


def int8_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, *, split_k: int | None = None
) -> torch.Tensor:
    """x (M, K) @ (qweight * scales[:, None])^T -> (M, N) in x.dtype.

    split_k: K splits of the GEMV path (M <= 8); None picks one from the grid size.
    """
    assert x.dim() == 2 and qweight.dim() == 2 and x.shape[1] == qweight.shape[1]
    assert qweight.dtype == torch.int8 and scales.shape == (qweight.shape[0],)
    # zeros and group_size are unused on the int8 path.
    return _launch(x, qweight, scales, scales, qweight.shape[0], 1, 8, split_k)


def int8_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    **_: object) -> torch.Tensor:
    """Dequantize, then an fp32 matmul (the CPU backend)."""
    w = qweight.float().mul_(scales.float()[:, None])  # (N, K)
    return (x.float() @ w.t()).to(x.dtype)


def int8_matmul_cost(m: int, n: int, k: int, dtype_bytes: int) -> KernelCost:
    """int8 weights + one scale per row + activations in and out; 2*M*N*K FLOPs."""
    bytes_moved = n * k + n * dtype_bytes + (m * k + m * n) * dtype_bytes
    return KernelCost(flops=2.0 * m * n * k, bytes=float(bytes_moved))


# ---------------------------------------------------------------------------------- int4
def quantize_int4(
    w: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise 4-bit: (packed (N, K//2) uint8, scales, zeros (N, K//group_size)).

    Each group's range is widened to include 0 so the zero point is an integer in 0..15.
    """
    n, k = w.shape
    assert group_size in (32, 64, 128), f"group_size must be 32, 64 or 128, got {group_size}"
    assert k % group_size == 0, f"K={k} is not divisible by group_size={group_size}"
    wg = w.float().view(n, k // group_size, group_size)  # (N, G, group_size)
    w_min = wg.amin(dim=2).clamp(max=0.0)
    w_max = wg.amax(dim=2).clamp(min=0.0)
    scales = ((w_max - w_min) / 15.0).clamp(min=1e-8).to(w.dtype)  # (N, G)
    zeros = torch.round(-w_min / scales.float()).clamp(0, 15).to(w.dtype)  # (N, G)
    q = torch.round(wg / scales.float()[..., None] + zeros.float()[..., None]).clamp(0, 15)
    q = q.to(torch.uint8).view(n, k)  # (N, K)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)  # (N, K//2): even column low nibble, odd high
    return packed, scales, zeros


def dequantize_int4(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """(N, K) weights in scales.dtype from the packed layout of quantize_int4."""
    n = packed.shape[0]
    q = torch.stack([packed & 0xF, packed >> 4], dim=2).view(n, -1)  # (N, K)
    qg = q.float().view(n, scales.shape[1], group_size)  # (N, G, group_size)
    w = qg.sub_(zeros.float()[..., None]).mul_(scales.float()[..., None])
    return w.view(n, -1).to(scales.dtype)


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    *,
    split_k: int | None = None,
) -> torch.Tensor:
    """x (M, K) @ dequantize_int4(packed, scales, zeros)^T -> (M, N) in x.dtype."""
    n, k = packed.shape[0], packed.shape[1] * 2
    assert x.dim() == 2 and x.shape[1] == k, (x.shape, packed.shape)
    assert packed.dtype == torch.uint8 and k % group_size == 0, (packed.dtype, k, group_size)
    assert scales.shape == zeros.shape == (n, k // group_size), (scales.shape, zeros.shape)
    assert group_size & (group_size - 1) == 0, "group_size must be a power of two"
    return _launch(x, packed, scales, zeros, n, group_size, 4, split_k)


def int4_matmul_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor, group_size: int, **_: object) -> torch.Tensor:
    """Dequantize, then an fp32 matmul (the CPU backend)."""
    w = dequantize_int4(packed, scales, zeros, group_size).float()  # (N, K)
    return (x.float() @ w.t()).to(x.dtype)


def int4_matmul_cost(m: int, n: int, k: int, group_size: int, dtype_bytes: int) -> KernelCost:
    """Packed nibbles + a scale and a zero per group + activations in and out; 2*M*N*K FLOPs."""
    weight_bytes = n * k // 2 + 2 * n * (k // group_size) * dtype_bytes
    bytes_moved = weight_bytes + (m * k + m * n) * dtype_bytes
    return KernelCost(flops=2.0 * m * n * k, bytes=float(bytes_moved))
