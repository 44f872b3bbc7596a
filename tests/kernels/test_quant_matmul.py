"""Weight-only int8 / int4 matmuls (Triton, interpreter on CPU) against the references."""

from __future__ import annotations

import pytest
import torch
from kernels_test_utils import DTYPES, tolerances

from kernels.quant_matmul import (
    dequantize_int4,
    int4_matmul,
    int4_matmul_cost,
    int4_matmul_ref,
    int8_matmul,
    int8_matmul_cost,
    int8_matmul_ref,
    quantize_int4,
    quantize_int8,
)

# M <= 8 takes the GEMV path, larger M the tl.dot GEMM path.
SHAPES = {"gemv-m1": (1, 48, 128), "gemv-m5": (5, 40, 256), "gemm-m20": (20, 70, 128),
          "gemm-m33": (33, 48, 256)}


def _inputs(m, n, k, dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=gen).to(dtype)
    x = (torch.randn(m, k, generator=gen) / k**0.5).to(dtype)  # outputs of order 1
    return x, w


@pytest.mark.parametrize("split_k", [None, 3], ids=["auto", "split3"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_int8_matches_ref(shape, dtype, split_k):
    x, w = _inputs(*shape, dtype)
    qweight, scales = quantize_int8(w)
    out = int8_matmul(x, qweight, scales, split_k=split_k)
    assert out.shape == (shape[0], shape[1]) and out.dtype == dtype
    torch.testing.assert_close(out, int8_matmul_ref(x, qweight, scales), **tolerances(dtype))


@pytest.mark.parametrize("split_k", [None, 2], ids=["auto", "split2"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("group_size", [32, 64, 128], ids=["g32", "g64", "g128"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_int4_matches_ref(shape, group_size, dtype, split_k):
    x, w = _inputs(*shape, dtype)
    packed, scales, zeros = quantize_int4(w, group_size)
    out = int4_matmul(x, packed, scales, zeros, group_size, split_k=split_k)
    ref = int4_matmul_ref(x, packed, scales, zeros, group_size)
    torch.testing.assert_close(out, ref, **tolerances(dtype))


@pytest.mark.parametrize("m", [2, 17], ids=["gemv", "gemm"])
def test_int4_odd_group_count(m):
    """K=96 with groups of 32: three groups, so a group boundary falls mid-tile pair."""
    x, w = _inputs(m, 24, 96, torch.float32)
    packed, scales, zeros = quantize_int4(w, 32)
    assert packed.shape == (24, 48) and scales.shape == zeros.shape == (24, 3)
    out = int4_matmul(x, packed, scales, zeros, 32)
    torch.testing.assert_close(out, int4_matmul_ref(x, packed, scales, zeros, 32),
                               **tolerances(torch.float32))


@pytest.mark.parametrize("group_size", [32, 128], ids=["g32", "g128"])
def test_int4_roundtrip_and_packing(group_size):
    _, w = _inputs(1, 16, 256, torch.float32)
    packed, scales, zeros = quantize_int4(w, group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (16, 128)
    assert zeros.min() >= 0 and zeros.max() <= 15 and torch.equal(zeros, zeros.round())
    w_hat = dequantize_int4(packed, scales, zeros, group_size)
    step = scales.repeat_interleave(group_size, dim=1)  # (N, K) quantization step
    assert ((w_hat - w).abs() <= step / 2 + 1e-6).all()
    # Column 0 lives in the low nibble of byte 0, column 1 in its high nibble.
    q0 = torch.round(w[:, 0] / scales[:, 0] + zeros[:, 0]).clamp(0, 15).to(torch.uint8)
    q1 = torch.round(w[:, 1] / scales[:, 0] + zeros[:, 0]).clamp(0, 15).to(torch.uint8)
    assert torch.equal(packed[:, 0], q0 | (q1 << 4))


def test_int8_roundtrip():
    _, w = _inputs(1, 16, 64, torch.float32)
    qweight, scales = quantize_int8(w)
    assert qweight.dtype == torch.int8 and scales.shape == (16,)
    assert ((qweight.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-6).all()


def test_costs():
    assert int8_matmul_cost(1, 10, 64, 2).bytes == 10 * 64 + 10 * 2 + (64 + 10) * 2
    cost = int4_matmul_cost(4, 10, 64, 32, 2)
    assert cost.bytes == 10 * 32 + 2 * 10 * 2 * 2 + (4 * 64 + 4 * 10) * 2
    assert cost.flops == 2 * 4 * 10 * 64
