"""FP8 / MXFP4 / NVFP4 matmuls dequantizing per tile: the Triton kernel (interpreter on a
CPU) and the torch CPU path, each against x @ dequantize(W)^T in float32."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_fp_linear import cpu_fp_linear, rows_per_chunk
from kernels.fp_format import quantize_fp8, quantize_mxfp4, quantize_nvfp4
from kernels.fp_matmul import GEMV_MAX_M, fp_matmul, fp_matmul_cost, fp_matmul_ref

N, K = 136, 160  # not multiples of the tiles; K = 5 MX blocks, 10 NV blocks; N > 128
FORMATS = {
    "fp8-tensor": lambda w: quantize_fp8(w, "tensor"),
    "fp8-channel": lambda w: quantize_fp8(w, "channel"),
    "fp8-block": lambda w: quantize_fp8(w, "block"),
    "mxfp4": quantize_mxfp4,
    "nvfp4": quantize_nvfp4,
}


def _inputs(m: int, n: int = N, k: int = K, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen) / k**0.5
    return x, w


@pytest.mark.parametrize("m", [1, 5, GEMV_MAX_M, 19])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_triton_kernel_matches_dequantized_matmul(fmt, m):
    x, w = _inputs(m)
    q = FORMATS[fmt](w)
    expect = x @ q.dequantize().t()
    torch.testing.assert_close(fp_matmul(x, q), expect, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fp_matmul_ref(x, q), expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kernel_decodes_every_code(fmt):
    """x = identity columns: each output row is one row of W, so every decoded weight is
    compared with dequantize() one for one (codes of all 256 / 16 values appear)."""
    k = 64
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(20, k, generator=gen) * torch.logspace(-6, 3, k)[None, :]
    q = FORMATS[fmt](w)
    eye = torch.eye(k)[:3]
    torch.testing.assert_close(fp_matmul(eye, q), q.dequantize()[:, :3].t(), atol=0, rtol=0)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cpu_path_matches_dequantized_matmul(fmt):
    x, w = _inputs(7)
    q = FORMATS[fmt](w)
    bias = torch.randn(N)
    expect = x @ q.dequantize().t() + bias
    torch.testing.assert_close(cpu_fp_linear(x, q, bias), expect, atol=1e-5, rtol=1e-5)
    # a 3-D input and bfloat16 activations keep their shape and dtype
    out = cpu_fp_linear(x.view(7, 1, K).bfloat16(), q)
    assert out.shape == (7, 1, N) and out.dtype == torch.bfloat16


def test_cpu_path_decodes_slices_of_rows(monkeypatch):
    """The CPU path never decodes more than a slice of rows: with a tiny budget it takes
    many slices, and the values are unchanged."""
    import kernels.cpu_fp_linear as mod

    x, w = _inputs(3)
    q = quantize_fp8(w, "block")
    seen: list[int] = []
    original = type(q).dequantize_rows

    def spy(self, start, stop):
        seen.append(stop - start)
        return original(self, start, stop)

    monkeypatch.setattr(mod, "CHUNK_VALUES", 8 * K)
    monkeypatch.setattr(type(q), "dequantize_rows", spy)
    out = cpu_fp_linear(x, q)
    assert rows_per_chunk(K) == 8 and max(seen) == 8 and sum(seen) == N
    torch.testing.assert_close(out, x @ q.dequantize().t(), atol=1e-5, rtol=1e-5)


def test_cost_counts_stored_bytes():
    q = quantize_mxfp4(torch.randn(64, 128))
    cost = fp_matmul_cost(2, q, act_bytes=2)
    assert cost.bytes == 64 * 64 + 64 * 4 + (2 * 128 + 2 * 64) * 2
    assert cost.flops == 2 * 2 * 64 * 128
