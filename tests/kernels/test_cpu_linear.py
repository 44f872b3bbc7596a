"""The C++ CPU linear (kernels/csrc/linear.cpp) against its float32 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu_linear import MAX_ROWS, cpu_linear, cpu_linear_cost, cpu_linear_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 16, MAX_ROWS])
@pytest.mark.parametrize("n,k", [(64, 32), (37, 100), (6, 17), (1, 48), (130, 576)])
def test_matches_reference(dtype, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen)
    for b in (None, bias):
        ref = cpu_linear_ref(x, w, b, out_float32=True)
        out = cpu_linear(x, w, b, out_float32=True)
        assert out.dtype == torch.float32 and out.shape == (m, n)
        # fp32 accumulation both sides, different summation order
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 * k ** 0.5)
        low = cpu_linear(x, w, b)
        assert low.dtype == dtype
        torch.testing.assert_close(low, ref.to(dtype), rtol=1e-2 if dtype != torch.float32
                                   else 1e-5, atol=1e-3 * k ** 0.5)


def test_strided_rows_and_noncontiguous_weight():
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(4, 96, generator=gen)
    x = big[:, 16:80]  # row stride 96, unit column stride
    w = torch.randn(33, 64, generator=gen)
    torch.testing.assert_close(cpu_linear(x, w), cpu_linear_ref(x, w), rtol=1e-5, atol=1e-4)
    wt = torch.randn(64, 33, generator=gen).t()  # a transposed view: copied contiguous
    torch.testing.assert_close(cpu_linear(x, wt), cpu_linear_ref(x, wt), rtol=1e-5, atol=1e-4)


def test_rejects_mismatched_inputs():
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        cpu_linear(x, torch.randn(4, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="expected x"):
        cpu_linear(x, torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_linear(x.double(), torch.randn(4, 8, dtype=torch.float64))


def test_kernel_linear_module_switches_to_blas_above_max_rows():
    from infbench.model.linear import CpuKernelLinear, kernel_linear, use_cpu_linears

    model = nn.Sequential(nn.Linear(48, 20), nn.Linear(20, 8, bias=False))
    assert use_cpu_linears(model, "cpu") == 2
    assert all(type(m) is CpuKernelLinear for m in model)
    for rows in (1, MAX_ROWS, MAX_ROWS + 1, 200):
        x = torch.randn(rows, 48)
        ref = nn.functional.linear(nn.functional.linear(x, model[0].weight, model[0].bias),
                                   model[1].weight)
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
    w = torch.randn(10, 48)
    assert kernel_linear(torch.randn(3, 48), w, out_float32=True).dtype == torch.float32
    assert use_cpu_linears(model, "torch") == 2  # back to the torch row-splitting path
    assert type(model[0]).__name__ == "CpuSplitLinear"


def test_cost_counts_weights_once():
    cost = cpu_linear_cost(1, 576, 1536, 2)
    assert cost.flops == 2 * 576 * 1536
    assert cost.bytes == (576 * 1536 + 1536 + 576) * 2


@pytest.mark.parametrize("choice", ["native", "float32"])
def test_bf16_gemm_either_way_matches_reference(monkeypatch, choice):
    from kernels import cpu_linear as mod

    monkeypatch.setenv(mod.BF16_GEMM_ENV, choice)
    mod.bf16_gemm_via_float32.cache_clear()
    try:
        assert mod.bf16_gemm_via_float32() is (choice == "float32")
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(64, 96, generator=gen).bfloat16()
        w = torch.randn(40, 96, generator=gen).bfloat16()
        b = torch.randn(40, generator=gen)
        ref = cpu_linear_ref(x, w, b, out_float32=True)
        out = mod.gemm(x, w, b)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=5e-2)
        torch.testing.assert_close(mod.gemm(x, w, b, out_float32=True), ref, rtol=1e-2, atol=5e-2)
    finally:
        mod.bf16_gemm_via_float32.cache_clear()


def test_bf16_gemm_choice_is_measured_without_the_override(monkeypatch):
    from kernels import cpu_linear as mod

    monkeypatch.delenv(mod.BF16_GEMM_ENV, raising=False)
    mod.bf16_gemm_via_float32.cache_clear()
    calls = []
    real = mod.F.linear
    monkeypatch.setattr(mod.F, "linear", lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    try:
        mod.bf16_gemm_via_float32()
        assert torch.bfloat16 in calls and torch.float32 in calls  # both ways were timed
    finally:
        mod.bf16_gemm_via_float32.cache_clear()
