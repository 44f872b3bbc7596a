"""rmsnorm (Triton, interpreter on CPU) against its torch reference and HF semantics."""

from __future__ import annotations

import pytest
import torch
from kernels_test_utils import DTYPES, tolerances

from kernels.rmsnorm import rmsnorm, rmsnorm_cost, rmsnorm_ref

SHAPES = {"t1-h64": (1, 64), "t7-h96": (7, 96), "t20-h576": (20, 576)}


def _inputs(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape[1], generator=gen)).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_matches_ref(shape, dtype):
    x, _, weight = _inputs(shape, dtype)
    out = rmsnorm(x, weight, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, rmsnorm_ref(x, weight, 1e-6), **tolerances(dtype))


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fused_residual_matches_ref(shape, dtype):
    x, residual, weight = _inputs(shape, dtype)
    x_before, r_before = x.clone(), residual.clone()
    out, new_residual = rmsnorm(x, weight, 1e-5, residual=residual)
    ref_out, ref_residual = rmsnorm_ref(x, weight, 1e-5, residual=residual)
    torch.testing.assert_close(new_residual, ref_residual, atol=0, rtol=0)
    torch.testing.assert_close(out, ref_out, **tolerances(dtype))
    assert torch.equal(x, x_before) and torch.equal(residual, r_before)  # inputs untouched


def test_ref_matches_hf_llama_rmsnorm():
    """Same arithmetic as transformers' LlamaRMSNorm.forward, written out."""
    x, residual, weight = _inputs((4, 32), torch.float16)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(rmsnorm_ref(x, weight, 1e-6), weight * h.to(torch.float16))
    added = x + residual
    h = added.float() * torch.rsqrt(added.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    out, new_res = rmsnorm_ref(x, weight, 1e-6, residual=residual)
    assert torch.equal(new_res, added) and torch.equal(out, weight * h.to(torch.float16))


def test_cost():
    plain, fused = rmsnorm_cost(8, 64, 2), rmsnorm_cost(8, 64, 2, has_residual=True)
    assert plain.bytes == (2 * 8 + 1) * 64 * 2 and fused.bytes == (4 * 8 + 1) * 64 * 2
