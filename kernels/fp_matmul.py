"""y = x @ dequant(W)^T for the low-precision float weights of `kernels/fp_format.py`
(FP8 E4M3 with tensor / channel / 128x128 block scales, MXFP4, NVFP4), dequantized per tile.

Each program owns a (BLOCK_M, BLOCK_N) output tile and walks K in BLOCK_K steps; a step
loads the stored bytes of a (BLOCK_N, BLOCK_K) weight tile and its scales and decodes them
to float32 in registers, so only the stored bytes cross the memory bus:
- fp8: one byte per weight, decoded from its bits (sign, 4-bit exponent biased by 7,
  3-bit mantissa; exponent 0 is subnormal m * 2^-9), times the float32 scale of its
  (row // block_n, column // block_k) block;
- mxfp4 / nvfp4: byte column // 2, nibble column % 2 (the even column is the low nibble),
  the E2M1 code decoded the same way (exponent biased by 1, 1-bit mantissa), times the
  E8M0 scale 2^(byte - 127) of its 32 columns (mxfp4) or the E4M3 scale of its 16 columns
  times the per-tensor float32 scale (nvfp4).
The codes are loaded as uint8 and decoded with integer ops and a bitcast: no fp8 dtype
reaches Triton, which keeps the same code valid in the interpreter and on GPUs without
FP8 loads.  A decoded weight times its scale is exact in float32, so a tile holds exactly
the values of `dequantize()`.  M <= GEMV_MAX_M multiplies and sums on CUDA cores (decode);
larger M runs tl.dot (prefill).  Under the interpreter use float32 activations (the
bfloat16 tl.dot bug of docs/kernels.md); with bfloat16 activations on a GPU the decoded
tile is rounded to bfloat16 before the dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, dot_precision, is_compiled
from kernels.cost import KernelCost
from kernels.fp_format import (
    MX_BLOCK,
    NV_BLOCK,
    FloatQuantWeight,
    Fp8Weight,
    Mxfp4Weight,
)

GEMV_MAX_M = 8
FMT_FP8, FMT_MXFP4, FMT_NVFP4 = 0, 1, 2


@triton.jit
def _e4m3_to_f32(b):
    """int32 bytes 0..255 of E4M3 codes -> float32 (0x7f / 0xff, NaN, are never stored)."""
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _e2m1_to_f32(c):
    """int32 E2M1 codes 0..15 -> float32."""
    e = (c >> 1) & 0x3
    m = c & 0x1
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((c & 0x8) != 0, -mag, mag)


@triton.jit
def _e8m0_to_f32(b):
    """int32 E8M0 bytes -> float32 2^(b - 127); byte 0 is the subnormal 2^-127."""
    return tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp_tile(w_ptr, s_ptr, g_ptr, offs_n, offs_k, N, K, block_n, block_k,
             stride_wn, stride_sn, stride_sg, FMT: tl.constexpr):
    """W[offs_n, offs_k] as float32 (BLOCK_N, BLOCK_K), decoded from the stored bytes."""
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    rows = offs_n[:, None]
    if FMT == 0:
        b = tl.load(w_ptr + rows * stride_wn + offs_k[None, :], mask=mask, other=0)
        s_off = (offs_n // block_n)[:, None] * stride_sn + (offs_k // block_k)[None, :] * stride_sg
        scale = tl.load(s_ptr + s_off, mask=mask, other=0.0)
        return _e4m3_to_f32(b.to(tl.int32)) * scale
    byte = tl.load(w_ptr + rows * stride_wn + (offs_k // 2)[None, :], mask=mask, other=0)
    code = (byte.to(tl.int32) >> ((offs_k % 2) * 4)[None, :]) & 0xF
    values = _e2m1_to_f32(code)
    if FMT == 1:
        sb = tl.load(s_ptr + rows * stride_sn + (offs_k // 32)[None, :] * stride_sg,
                     mask=mask, other=127)
        return values * _e8m0_to_f32(sb.to(tl.int32))
    sb = tl.load(s_ptr + rows * stride_sn + (offs_k // 16)[None, :] * stride_sg,
                 mask=mask, other=0)
    return values * (_e4m3_to_f32(sb.to(tl.int32)) * tl.load(g_ptr))


@triton.jit
def _fp_matmul_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, M, N, K, block_n, block_k,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sg, stride_om, stride_on,
    FMT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w = _fp_tile(w_ptr, s_ptr, g_ptr, offs_n, offs_k, N, K, block_n, block_k,
                     stride_wn, stride_sn, stride_sg, FMT)
        if USE_DOT:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
        else:  # (BLOCK_M, 1, BLOCK_K) * (1, BLOCK_N, BLOCK_K) summed over K
            acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], 2)
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _parts(w: FloatQuantWeight) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor,
                                          int, int]:
    """(FMT, uint8 codes, scales, global-scale pointer, block_n, block_k) for the kernel."""
    if isinstance(w, Fp8Weight):
        assert w.codes.dtype == torch.float8_e4m3fn and w.scales.dtype == torch.float32
        return FMT_FP8, w.codes.view(torch.uint8), w.scales, w.scales, w.block_n, w.block_k
    if isinstance(w, Mxfp4Weight):
        assert w.scales.dtype == torch.uint8
        return FMT_MXFP4, w.packed, w.scales, w.scales, 1, MX_BLOCK
    assert w.scales.dtype == torch.float8_e4m3fn and w.global_scale.numel() == 1
    g = w.global_scale.float().reshape(1)
    return FMT_NVFP4, w.packed, w.scales.view(torch.uint8), g, 1, NV_BLOCK


def fp_matmul(x: torch.Tensor, w: FloatQuantWeight) -> torch.Tensor:
    """x (M, K) @ w.dequantize()^T -> (M, N) in x.dtype, weights decoded per tile."""
    n, k = w.shape
    assert x.dim() == 2 and x.shape[1] == k, (x.shape, w.shape)
    fmt, codes, scales, g, block_n, block_k = _parts(w)
    assert codes.is_contiguous() and codes.device == x.device == scales.device
    m = x.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)  # (M, N)
    if m == 0 or n == 0:
        return out
    compiled = is_compiled(x)
    use_dot = m > GEMV_MAX_M
    tile_k = 64 if compiled else 32
    if use_dot:
        tile_m, tile_n = (64 if compiled or m >= 64 else max(16, triton.next_power_of_2(m))), 64
    else:
        tile_m, tile_n = triton.next_power_of_2(m), 32
    s_strides = (scales.stride(0), scales.stride(1))
    grid = (cdiv(m, tile_m), cdiv(n, tile_n))
    _fp_matmul_kernel[grid](
        x, codes, scales, g, out, m, n, k, block_n, block_k,
        *x.stride(), codes.stride(0), *s_strides, *out.stride(),
        FMT=fmt, BLOCK_M=tile_m, BLOCK_N=tile_n, BLOCK_K=tile_k,
        USE_DOT=use_dot, DOT_PRECISION=dot_precision(x.dtype),
    )
    return out


def fp_matmul_ref(x: torch.Tensor, w: FloatQuantWeight) -> torch.Tensor:
    """Dequantize the whole matrix, then a float32 matmul (the exact reference)."""
    return (x.float() @ w.dequantize().t()).to(x.dtype)


def fp_matmul_cost(m: int, w: FloatQuantWeight, act_bytes: int) -> KernelCost:
    """The stored bytes of W (codes and scales) + activations in and out; 2*M*N*K FLOPs."""
    n, k = w.shape
    return KernelCost(flops=2.0 * m * n * k, bytes=float(w.nbytes + (m * k + m * n) * act_bytes))
