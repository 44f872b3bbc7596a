"""Weight-only int8 / int4 matmuls (Triton, interpreter on CPU) on the stored format of
kernels/quant_format.py, against its dequantize() and a float32 matmul."""

from __future__ import annotations

import os

import pytest
import torch
from kernels_test_utils import tolerances

from kernels.quant_format import BLOCK, Int4Weight, Int8Weight, quantize_int4, quantize_int8
from kernels.quant_matmul import (
    GEMV_MAX_M,
    int4_matmul,
    int4_matmul_cost,
    int4_matmul_ref,
    int8_matmul,
    int8_matmul_cost,
    int8_matmul_ref,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
MS = [1, 3, 8, 17, 64]  # M <= 8 takes the GEMV path, larger M the tl.dot GEMM path
N, K = 40, 384  # N not a multiple of the N tile; K = 3 groups of 128, 6 of 64, 12 of 32


def _dtypes(m: int) -> list:
    """fp32 and fp16 everywhere; bf16 on a GPU, and under the interpreter only on the GEMV
    path (its tl.dot on bfloat16 operands returns garbage: /work/shared/ENVIRONMENT.md)."""
    out = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
    if not INTERPRETED or m <= GEMV_MAX_M:
        out.append(pytest.param(torch.bfloat16, id="bf16"))
    return out


CASES = [pytest.param(m, dt, id=f"m{m}-{p.id}") for m in MS
         for p in _dtypes(m) for dt in p.values]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else tolerances(dtype)


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = (torch.randn(m, k, generator=gen) / k**0.5).to(dtype)  # outputs of order 1
    return x.to(DEVICE), w


def _to(w, device):
    fields = {f: getattr(w, f) for f in w.__dataclass_fields__}
    return type(w)(**{f: v.to(device) if isinstance(v, torch.Tensor) else v
                      for f, v in fields.items()})


def _expected(x: torch.Tensor, w: Int8Weight | Int4Weight) -> torch.Tensor:
    """What the kernels compute: the format's own dequantize() and a float32 matmul."""
    return (x.float().cpu() @ w.dequantize().t()).to(x.dtype)


@pytest.mark.parametrize("group_size", [None, 32, 64, 128], ids=["row", "g32", "g64", "g128"])
@pytest.mark.parametrize(("m", "dtype"), CASES)
def test_int8_matches_dequantized(m, dtype, group_size):
    x, w = _inputs(m, N, K, dtype)
    qw = quantize_int8(w, group_size)
    out = int8_matmul(x, _to(qw, DEVICE))
    assert out.shape == (m, N) and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), _expected(x, qw), **_tol(dtype))


@pytest.mark.parametrize("group_size", [32, 64, 128], ids=["g32", "g64", "g128"])
@pytest.mark.parametrize(("m", "dtype"), CASES)
def test_int4_matches_dequantized(m, dtype, group_size):
    x, w = _inputs(m, N, K, dtype)
    qw = quantize_int4(w, group_size)
    out = int4_matmul(x, _to(qw, DEVICE))
    assert out.shape == (m, N) and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), _expected(x, qw), **_tol(dtype))


@pytest.mark.parametrize("split_k", [1, 2, 5])
@pytest.mark.parametrize("bits", [8, 4])
def test_gemv_split_k(bits, split_k):
    """Explicit K splits (5 does not divide the tiles evenly) sum to the same product."""
    x, w = _inputs(3, N, K, torch.float32)
    qw = quantize_int8(w, 64) if bits == 8 else quantize_int4(w, 64)
    fn = int8_matmul if bits == 8 else int4_matmul
    out = fn(x, _to(qw, DEVICE), split_k=split_k)  # type: ignore[operator]
    torch.testing.assert_close(out.cpu(), _expected(x, qw), **tolerances(torch.float32))


@pytest.mark.parametrize("m", [2, 20], ids=["gemv", "gemm"])
@pytest.mark.parametrize(("k", "group_size"), [(96, 24), (192, 192), (96, 48)],
                         ids=["col-scales-g24", "row-K192", "g48"])
def test_int8_uneven_groups(m, k, group_size):
    """Groups that are not a power of two (a scale per column when narrower than 16) and a
    per-row K that is not a multiple of the K tile."""
    x, w = _inputs(m, 24, k, torch.float32)
    qw = quantize_int8(w, group_size)
    out = int8_matmul(x, _to(qw, DEVICE))
    torch.testing.assert_close(out.cpu(), _expected(x, qw), **tolerances(torch.float32))


@pytest.mark.parametrize("m", [2, 20], ids=["gemv", "gemm"])
def test_int4_group_of_96(m):
    """A group of three 32-column blocks: tiles of 32 columns, three per group."""
    x, w = _inputs(m, 24, 192, torch.float32)
    qw = quantize_int4(w, 96)
    out = int4_matmul(x, _to(qw, DEVICE))
    torch.testing.assert_close(out.cpu(), _expected(x, qw), **tolerances(torch.float32))


def test_int4_reads_gguf_nibble_order():
    """Codes set one column at a time: the kernel must find column c at byte
    (c // 32) * 16 + c % 16 of its row, in the high nibble when c % 32 >= 16."""
    n, k = 4, 64
    codes = torch.zeros(n, k, dtype=torch.uint8)
    for c in (0, 5, 16, 21, 31, 32, 47, 63):
        codes[:, c] = 1 + c % 15
    packed = codes.view(n, k // BLOCK, 2, BLOCK // 2)
    packed = (packed[:, :, 0] | (packed[:, :, 1] << 4)).reshape(n, k // 2)
    qw = Int4Weight(packed, torch.ones(n, 2, dtype=torch.float16),
                    torch.zeros(n, 2, dtype=torch.float16), 32)
    x = torch.eye(k, dtype=torch.float32)[:20].to(DEVICE)  # rows 0..19 pick columns 0..19
    out = int4_matmul(x, _to(qw, DEVICE)).cpu()  # GEMM path: (20, n)
    assert torch.equal(out, codes[:, :20].t().float())
    for m in (1, 5):  # GEMV path
        out = int4_matmul(torch.eye(k)[16:16 + m].to(DEVICE), _to(qw, DEVICE)).cpu()
        assert torch.equal(out, codes[:, 16:16 + m].t().float())


def test_refs_are_dequantize_then_matmul():
    x, w = _inputs(5, 8, 64, torch.float32)
    for qw, ref in ((quantize_int8(w), int8_matmul_ref), (quantize_int4(w, 32), int4_matmul_ref)):
        torch.testing.assert_close(ref(x.cpu(), qw), x.cpu() @ qw.dequantize().t())


def test_rejects_mismatched_shapes():
    x, w = _inputs(2, 8, 64, torch.float32)
    with pytest.raises(AssertionError):
        int8_matmul(x[:, :32], _to(quantize_int8(w), DEVICE))
    with pytest.raises(AssertionError):
        int4_matmul(x[:, :32], _to(quantize_int4(w, 32), DEVICE))


def test_costs():
    # int8 per row: N*K bytes + one fp16 scale a row; per group of 32: K/32 fp16 scales a row.
    assert int8_matmul_cost(1, 10, 64, 2).bytes == 10 * 64 + 10 * 2 + (64 + 10) * 2
    assert int8_matmul_cost(1, 10, 64, 4, 32).bytes == 10 * 64 + 10 * 2 * 2 + (64 + 10) * 4
    cost = int4_matmul_cost(4, 10, 64, 32, 4)  # fp16 scale + fp16 min per group of 32
    assert cost.bytes == 10 * 32 + 10 * 2 * (2 + 2) + (4 * 64 + 4 * 10) * 4
    assert cost.flops == 2 * 4 * 10 * 64
    # The weight bytes priced are exactly what the format stores.
    w = torch.randn(10, 64)
    for qw, c in ((quantize_int8(w), int8_matmul_cost(1, 10, 64, 0)),
                  (quantize_int8(w, 32), int8_matmul_cost(1, 10, 64, 0, 32)),
                  (quantize_int4(w, 32), int4_matmul_cost(1, 10, 64, 32, 0))):
        assert c.bytes == qw.nbytes


@pytest.mark.skipif(not CUDA, reason="QuantLinear takes the Triton kernels only for CUDA inputs")
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quant_linear_cuda_uses_triton(kind):
    from infbench.model.quant import QuantLinear

    x, w = _inputs(6, 48, 128, torch.bfloat16)
    qw = quantize_int8(w) if kind == "int8" else quantize_int4(w, 64)
    bias = torch.randn(48)
    lin = QuantLinear(qw, bias, torch.bfloat16).to(DEVICE)
    x3 = x.view(2, 3, 128)
    out = lin(x3)
    assert out.shape == (2, 3, 48) and out.dtype == torch.bfloat16 and out.is_cuda
    torch.testing.assert_close(out.float(), lin.reference(x3).float(), atol=3e-2, rtol=3e-2)
