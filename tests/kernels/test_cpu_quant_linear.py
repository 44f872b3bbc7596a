"""The C++ weight-only int8 / int4 projection (kernels/csrc/linear.cpp) against its reference:
a quantized linear equals the matmul with its dequantized weights."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import module
from kernels.cpu_quant_linear import (
    MAX_ROWS,
    cpu_dequantize,
    cpu_dequantize_ref,
    cpu_quant_linear,
    cpu_quant_linear_cost,
    cpu_quant_linear_ref,
)
from kernels.quant_format import (
    ACT_BLOCK,
    Int4Weight,
    Int8Weight,
    quantize_activations,
    quantize_int4,
    quantize_int8,
)

FORMATS = {
    "int8-row": lambda w: quantize_int8(w),
    "int8-g32": lambda w: quantize_int8(w, 32),  # GGUF Q8_0's grouping
    "int4-g32": lambda w: quantize_int4(w, 32),  # GGUF Q4_1's grouping
    "int4-g64": lambda w: quantize_int4(w, 64),
}
ACT_FORMATS = {**FORMATS, "int4-g128": lambda w: quantize_int4(w, 128),
               "int8-g64": lambda w: quantize_int8(w, 64)}  # no VNNI path: the float one


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, MAX_ROWS])
@pytest.mark.parametrize("n,k", [(130, 576), (7, 64), (33, 2048)])
def test_matches_dequantized_matmul(fmt, dtype, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w = FORMATS[fmt](torch.randn(n, k, generator=gen))
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen)
    for b in (None, bias):
        ref = cpu_quant_linear_ref(x, w, b, out_float32=True)
        out = cpu_quant_linear(x, w, b, out_float32=True)
        assert out.dtype == torch.float32 and out.shape == (m, n)
        # the same float32 products, summed in another order
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 * k ** 0.5)
        low = cpu_quant_linear(x, w, b)
        assert low.dtype == dtype
        torch.testing.assert_close(low, ref.to(dtype), rtol=1e-2 if dtype != torch.float32
                                   else 1e-5, atol=1e-3 * k ** 0.5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_reference(fmt, dtype):
    w = FORMATS[fmt](torch.randn(45, 192, generator=torch.Generator().manual_seed(3)))
    torch.testing.assert_close(cpu_dequantize(w, dtype), cpu_dequantize_ref(w, dtype),
                               rtol=0, atol=0)


def test_a_flipped_code_changes_the_output():
    """The kernel reads every nibble: changing one code changes exactly that output row."""
    w = quantize_int4(torch.randn(8, 64, generator=torch.Generator().manual_seed(4)), 32)
    x = torch.ones(1, 64)
    before = cpu_quant_linear(x, w)
    packed = w.packed.clone()
    packed[5, 3] ^= 0x10  # row 5, column 3 + 16's code
    after = cpu_quant_linear(x, Int4Weight(packed, w.scales, w.mins, w.group_size))
    changed = (after - before).abs().squeeze(0) > 0
    assert changed.tolist() == [i == 5 for i in range(8)]
    delta = (after - before)[0, 5].item()
    assert abs(abs(delta) - w.scales[5, 0].float().item()) < 1e-3  # one step of the scale


def test_bad_shapes_are_refused():
    w = quantize_int8(torch.randn(4, 64))
    with pytest.raises(RuntimeError, match="at most 32 rows"):
        cpu_quant_linear(torch.randn(MAX_ROWS + 1, 64), w)
    with pytest.raises(RuntimeError, match="group_size"):
        cpu_quant_linear(torch.randn(1, 64), Int8Weight(w.q, w.scales, 48))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_quant_linear(torch.randn(1, 64).half(), w)


def test_cost_counts_the_packed_bytes():
    w = quantize_int4(torch.randn(64, 128), 32)
    cost = cpu_quant_linear_cost(1, w, act_bytes=4)
    assert cost.bytes == 64 * 64 + 2 * 64 * 4 * 2 + (128 + 64) * 4
    assert cost.flops == 2 * 64 * 128


# ---- quant.activations: int8 (kernels/csrc/linear_q8act.cpp) ----------------------------

def test_activation_rounding_is_blockwise_int8():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 100, generator=gen) * torch.logspace(-3, 2, 100)  # a last block of 4
    xq = quantize_activations(x)
    assert xq.shape == x.shape and xq.dtype == torch.float32
    for start in range(0, 100, ACT_BLOCK):
        block, qb = x[:, start:start + ACT_BLOCK], xq[:, start:start + ACT_BLOCK]
        scale = block.abs().amax(dim=1, keepdim=True) / 127
        codes = qb / scale
        torch.testing.assert_close(codes, codes.round(), rtol=0, atol=1e-3)
        assert codes.abs().max().item() <= 127 + 1e-3
        assert ((qb - block).abs() <= scale / 2 + 1e-6).all()  # round to nearest
    assert quantize_activations(torch.zeros(2, 64)).eq(0).all()  # a zero block stays zero


@pytest.mark.parametrize("fmt", ACT_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("n,k", [(130, 576), (7, 128), (9, 1536)])
def test_int8_activations_equal_the_product_of_the_rounded_activations(fmt, dtype, m, n, k):
    """At M = 1 the integer VNNI path (where the CPU has it), else the float path on the
    rounded activations: both equal dequant(w) times quantize_activations(x)."""
    if k % 128 and fmt == "int4-g128":
        pytest.skip("128 does not divide k")
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    w = ACT_FORMATS[fmt](torch.randn(n, k, generator=gen))
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    bias = torch.randn(n, generator=gen)
    for b in (None, bias):
        ref = cpu_quant_linear_ref(quantize_activations(x), w, b, out_float32=True)
        out = cpu_quant_linear(x, w, b, out_float32=True, act_int8=True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 * k ** 0.5)
        exact = cpu_quant_linear(x, w, b, out_float32=True)
        assert (out - exact).abs().max().item() > 0  # the rounding is applied


def test_int8_activation_error_is_that_of_the_rounding():
    """Against the exact product, the int8 path's error is about 0.5% of the output's norm
    on random data (each activation moves by up to half a step of max|x| / 127), int4's the
    same as int8's: the minimums multiply the rounded activations too."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 576, generator=gen)
    for make in (FORMATS["int8-row"], FORMATS["int4-g32"], FORMATS["int4-g64"]):
        w = make(torch.randn(960, 576, generator=gen) * 0.02)
        exact = cpu_quant_linear(x, w, out_float32=True)
        got = cpu_quant_linear(x, w, out_float32=True, act_int8=True)
        rel = ((got - exact).norm() / exact.norm()).item()
        assert 1e-4 < rel < 0.01


def test_vnni_path_is_reported():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    expect = "avx512_vnni" in flags and "avx512bw" in flags and "avx512vl" in flags
    assert module().quant_gemv_q8act_supported() == expect
