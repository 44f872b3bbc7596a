"""The C++ weight-only int8 / int4 projection (kernels/csrc/linear.cpp) against its reference:
a quantized linear equals the matmul with its dequantized weights."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_quant_linear import (
    MAX_ROWS,
    cpu_dequantize,
    cpu_dequantize_ref,
    cpu_quant_linear,
    cpu_quant_linear_cost,
    cpu_quant_linear_ref,
)
from kernels.quant_format import Int4Weight, Int8Weight, quantize_int4, quantize_int8

FORMATS = {
    "int8-row": lambda w: quantize_int8(w),
    "int8-g32": lambda w: quantize_int8(w, 32),  # GGUF Q8_0's grouping
    "int4-g32": lambda w: quantize_int4(w, 32),  # GGUF Q4_1's grouping
    "int4-g64": lambda w: quantize_int4(w, 64),
}


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
