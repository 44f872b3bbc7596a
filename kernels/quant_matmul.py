"""Weight-only quantized matmul: y = x @ dequant(W)^T with the int8 / int4 weights of
`kernels/quant_format.py` (the one stored format of every backend).

int8 (`Int8Weight`): W[n, k] ~= q[n, k] * scales[n, k // group_size], q int8, scales fp16;
      group_size = K is one scale per output channel, 32 is GGUF's Q8_0.
int4 (`Int4Weight`): W[n, k] ~= q[n, k] * scales[n, g] + mins[n, g] with g = k // group_size,
      q in 0..15, scales and mins fp16 (GGUF's Q4_1).  Nibbles are packed in blocks of 32
      columns: byte j of a block holds column j in its low nibble and column j + 16 in its
      high nibble.

Weights are dequantized inside the kernels, tile by tile, so only the stored bytes cross
the memory bus.  A K tile never straddles a scale group (BLOCK_K divides group_size, or
there is one group per row), so each tile loads one scale (and min) per output row.  An
int4 tile of BLOCK_K columns is BLOCK_K // 32 whole blocks: its BLOCK_K // 2 bytes are
loaded once and split into the low-nibble half (columns j of each block) and the
high-nibble half (columns j + 16), each multiplied with the matching activation columns.
Two kernels share the dequantization:
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
from kernels.quant_format import BLOCK, Int4Weight, Int8Weight

GEMV_MAX_M = 8


@triton.jit
def _row_params(ptr, offs_n, k0, N, group_size, stride_sn, stride_sg):
    """fp32 scales (or mins) of the group holding column k0, for rows offs_n: (BLOCK_N,)."""
    s_off = offs_n * stride_sn + (k0 // group_size) * stride_sg
    return tl.load(ptr + s_off, mask=offs_n < N, other=0.0).to(tl.float32)


@triton.jit
def _int8_tile(w_ptr, scale_ptr, offs_n, offs_k, k0, N, K, group_size,
               stride_wn, stride_wk, stride_sn, stride_sg, COL_SCALES: tl.constexpr):
    """W[offs_n, offs_k] as fp32 (BLOCK_N, BLOCK_K).  The tile lies in the group of k0
    unless COL_SCALES, which loads each column's scale (groups narrower than 16 columns)."""
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    q = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                mask=mask, other=0).to(tl.float32)
    if COL_SCALES:
        groups = offs_k // group_size
        s_ptrs = scale_ptr + offs_n[:, None] * stride_sn + groups[None, :] * stride_sg
        return q * tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
    scale = _row_params(scale_ptr, offs_n, k0, N, group_size, stride_sn, stride_sg)
    return q * scale[:, None]


@triton.jit
def _int4_tiles(w_ptr, scale_ptr, min_ptr, offs_n, k0, N, K, group_size,
                stride_wn, stride_wk, stride_sn, stride_sg, BLOCK_K: tl.constexpr):
    """The int4 tile W[offs_n, k0:k0+BLOCK_K] as two fp32 (BLOCK_N, BLOCK_K // 2) halves
    (low nibbles, high nibbles) and the column index of each low-half entry (BLOCK_K // 2,);
    the high half's columns are those + 16.  k0 is a multiple of 32, and the tile lies in
    one group."""
    HALF: tl.constexpr = BLOCK_K // 2
    p = tl.arange(0, HALF)  # byte within the tile
    cols_lo = k0 + (p // 16) * 32 + p % 16  # column of the low nibble of byte p
    mask = (offs_n[:, None] < N) & (cols_lo[None, :] < K)
    byte = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 2 + p)[None, :] * stride_wk,
                   mask=mask, other=0).to(tl.int32)
    scale = _row_params(scale_ptr, offs_n, k0, N, group_size, stride_sn, stride_sg)
    mn = _row_params(min_ptr, offs_n, k0, N, group_size, stride_sn, stride_sg)
    w_lo = (byte & 0xF).to(tl.float32) * scale[:, None] + mn[:, None]
    w_hi = ((byte >> 4) & 0xF).to(tl.float32) * scale[:, None] + mn[:, None]
    return w_lo, w_hi, cols_lo


@triton.jit
def _load_x(x_ptr, offs_m, cols, M, K, stride_xm, stride_xk):
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] * stride_xk,
                   mask=(offs_m[:, None] < M) & (cols[None, :] < K), other=0.0)


@triton.jit
def _quant_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, min_ptr, out_ptr, M, N, K, group_size, k_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg,
    stride_os, stride_om, stride_on,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    COL_SCALES: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        # (BLOCK_M, 1, BLOCK_K) * (1, BLOCK_N, BLOCK_K) summed over K -> (BLOCK_M, BLOCK_N)
        if BITS == 8:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            w = _int8_tile(w_ptr, scale_ptr, offs_n, offs_k, k0, N, K, group_size,
                           stride_wn, stride_wk, stride_sn, stride_sg, COL_SCALES)
            x = _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, stride_xk).to(tl.float32)
            acc += tl.sum(x[:, None, :] * w[None, :, :], 2)
        else:
            w_lo, w_hi, cols = _int4_tiles(w_ptr, scale_ptr, min_ptr, offs_n, k0, N, K,
                                           group_size, stride_wn, stride_wk, stride_sn,
                                           stride_sg, BLOCK_K)
            x_lo = _load_x(x_ptr, offs_m, cols, M, K, stride_xm, stride_xk).to(tl.float32)
            x_hi = _load_x(x_ptr, offs_m, cols + 16, M, K, stride_xm, stride_xk).to(tl.float32)
            acc += tl.sum(x_lo[:, None, :] * w_lo[None, :, :], 2)
            acc += tl.sum(x_hi[:, None, :] * w_hi[None, :, :], 2)
    o_ptrs = out_ptr + split * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _quant_gemm_kernel(
    x_ptr, w_ptr, scale_ptr, min_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_om, stride_on,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    COL_SCALES: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if BITS == 8:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, stride_xk)
            w = _int8_tile(w_ptr, scale_ptr, offs_n, offs_k, k0, N, K, group_size,
                           stride_wn, stride_wk, stride_sn, stride_sg, COL_SCALES)
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
        else:
            w_lo, w_hi, cols = _int4_tiles(w_ptr, scale_ptr, min_ptr, offs_n, k0, N, K,
                                           group_size, stride_wn, stride_wk, stride_sn,
                                           stride_sg, BLOCK_K)
            x_lo = _load_x(x_ptr, offs_m, cols, M, K, stride_xm, stride_xk)
            x_hi = _load_x(x_ptr, offs_m, cols + 16, M, K, stride_xm, stride_xk)
            acc = tl.dot(x_lo, tl.trans(w_lo.to(x_lo.dtype)), acc,
                         input_precision=DOT_PRECISION)
            acc = tl.dot(x_hi, tl.trans(w_hi.to(x_hi.dtype)), acc,
                         input_precision=DOT_PRECISION)
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _tiling(m: int, k: int, group_size: int, bits: int, compiled: bool) -> tuple[int, bool]:
    """(BLOCK_K, COL_SCALES).  BLOCK_K is a power of two that divides group_size, so a tile
    lies in one scale group, unless the row is one group (per-channel int8: any tile).
    int4 groups are whole 32-column blocks, so its tiles are too.  An int8 group narrower
    than 16 columns would make tl.dot's K too short: COL_SCALES tiles load a scale per
    column instead."""
    cap = 128
    if compiled:  # the GEMV's 3-D (M, N, K) product lives in registers; a 64x64 GEMM tile
        cap = 64 if m <= 2 else 32  # with BLOCK_K 64 spills at 4 warps (ptxas, sm_90)
    one_group = group_size >= k
    block_k = triton.next_power_of_2(k) if one_group else group_size & -group_size
    col_scales = bits == 8 and block_k < 16
    if col_scales:
        block_k = triton.next_power_of_2(k)
    return max(min(block_k, cap), 16), col_scales


def _launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
            n: int, group_size: int, bits: int, split_k: int | None) -> torch.Tensor:
    m, k = x.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)  # (M, N)
    if m == 0 or n == 0:
        return out
    compiled = is_compiled(x)
    block_k, col_scales = _tiling(m, k, group_size, bits, compiled)
    s_strides = (scales.stride(0), scales.stride(1))
    if m <= GEMV_MAX_M:
        block_n = 32 if compiled else 64
        num_n = cdiv(n, block_n)
        k_tiles = cdiv(k, block_k)
        if split_k is None:  # fill ~2 waves of programs, at least 4 K-tiles per split
            split_k = max(1, min(cdiv(2 * num_compute_units(x.device), num_n), k_tiles // 4))
        split_k = max(1, min(split_k, k_tiles))
        k_per_split = cdiv(k_tiles, split_k) * block_k  # whole tiles: splits stay in groups
        split_k = cdiv(k, k_per_split)  # drop splits that would be empty
        dest = out if split_k == 1 else torch.empty(  # (S, M, N) fp32 partial sums
            split_k, m, n, dtype=torch.float32, device=x.device)
        d_strides = (0, *out.stride()) if split_k == 1 else dest.stride()
        _quant_gemv_kernel[(num_n, split_k)](
            x, w, scales, mins, dest, m, n, k, group_size, k_per_split,
            *x.stride(), *w.stride(), *s_strides, *d_strides,
            BITS=bits, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k,
            COL_SCALES=col_scales,
        )
        if split_k > 1:
            out.copy_(dest.sum(0))
        return out
    block_m = 64 if compiled or m >= 64 else max(16, triton.next_power_of_2(m))
    block_n = 64
    _quant_gemm_kernel[(cdiv(m, block_m), cdiv(n, block_n))](
        x, w, scales, mins, out, m, n, k, group_size,
        *x.stride(), *w.stride(), *s_strides, *out.stride(),
        BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        COL_SCALES=col_scales, DOT_PRECISION=dot_precision(x.dtype),
    )
    return out


# ---------------------------------------------------------------------------------- int8
def int8_matmul(x: torch.Tensor, w: Int8Weight, *, split_k: int | None = None) -> torch.Tensor:
    """x (M, K) @ w.dequantize()^T -> (M, N) in x.dtype.

    split_k: K splits of the GEMV path (M <= 8); None picks one from the grid size.
    """
    n, k = w.shape
    assert x.dim() == 2 and x.shape[1] == k, (x.shape, w.shape)
    assert w.q.dtype == torch.int8 and k % w.group_size == 0, (w.q.dtype, k, w.group_size)
    assert w.scales.shape == (n, k // w.group_size), (w.scales.shape, w.group_size)
    assert w.q.device == x.device == w.scales.device, (x.device, w.q.device)
    # int8 has no mins: the scales stand in for the unused pointer.
    return _launch(x, w.q, w.scales, w.scales, n, w.group_size, 8, split_k)


def int8_matmul_ref(x: torch.Tensor, w: Int8Weight, **_: object) -> torch.Tensor:
    """Dequantize, then an fp32 matmul."""
    return (x.float() @ w.dequantize().t()).to(x.dtype)


def int8_matmul_cost(m: int, n: int, k: int, dtype_bytes: int,
                     group_size: int | None = None) -> KernelCost:
    """int8 weights + an fp16 scale per group (per row when group_size is None) +
    activations in and out; 2*M*N*K FLOPs."""
    groups = 1 if group_size is None else k // group_size
    bytes_moved = n * k + n * groups * 2 + (m * k + m * n) * dtype_bytes
    return KernelCost(flops=2.0 * m * n * k, bytes=float(bytes_moved))


# ---------------------------------------------------------------------------------- int4
def int4_matmul(x: torch.Tensor, w: Int4Weight, *, split_k: int | None = None) -> torch.Tensor:
    """x (M, K) @ w.dequantize()^T -> (M, N) in x.dtype.

    split_k: K splits of the GEMV path (M <= 8); None picks one from the grid size.
    """
    n, k = w.shape
    g = w.group_size
    assert x.dim() == 2 and x.shape[1] == k, (x.shape, w.shape)
    assert w.packed.dtype == torch.uint8, w.packed.dtype
    assert g % BLOCK == 0 and k % g == 0, (k, g)
    assert w.scales.shape == w.mins.shape == (n, k // g), (w.scales.shape, w.mins.shape)
    assert w.mins.stride() == w.scales.stride(), (w.mins.stride(), w.scales.stride())
    assert w.packed.device == x.device == w.scales.device, (x.device, w.packed.device)
    return _launch(x, w.packed, w.scales, w.mins, n, g, 4, split_k)


def int4_matmul_ref(x: torch.Tensor, w: Int4Weight, **_: object) -> torch.Tensor:
    """Dequantize, then an fp32 matmul."""
    return (x.float() @ w.dequantize().t()).to(x.dtype)


def int4_matmul_cost(m: int, n: int, k: int, group_size: int, dtype_bytes: int) -> KernelCost:
    """Packed nibbles + an fp16 scale and an fp16 min per group + activations in and out;
    2*M*N*K FLOPs."""
    weight_bytes = n * k // 2 + 2 * n * (k // group_size) * 2
    bytes_moved = weight_bytes + (m * k + m * n) * dtype_bytes
    return KernelCost(flops=2.0 * m * n * k, bytes=float(bytes_moved))
