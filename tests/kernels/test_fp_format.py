"""FP8 / MXFP4 / NVFP4 stored formats (kernels/fp_format.py): the code tables against the
OCP MX v1.0 and OFP8 values, exact round trips of representable values, the spec's rounding
and scale choice, and the stored bytes."""

from __future__ import annotations

import pytest
import torch

from kernels.fp_format import (
    E2M1_VALUES,
    decode_e2m1,
    decode_e8m0,
    e2m1_table,
    fake_quantize_fp4_rows,
    fake_quantize_fp8_rows,
    mx_exponents,
    pack_fp4,
    quantize_fp8,
    quantize_mxfp4,
    quantize_nvfp4,
    round_e2m1,
    round_e4m3,
    unpack_fp4,
)


def test_e2m1_table_is_the_spec():
    # OCP MX v1.0 section 5.3.3: E2M1, exponent bias 1, one mantissa bit, no inf/NaN
    spec = []
    for code in range(16):
        sign, exp, man = code >> 3, (code >> 1) & 3, code & 1
        mag = man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1)
        spec.append(-mag if sign else mag)
    assert e2m1_table().tolist() == spec
    assert list(E2M1_VALUES) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e8m0_table_is_the_spec():
    # E8M0: 2^(byte - 127), byte 0 is 2^-127, 254 is 2^127
    b = torch.arange(255, dtype=torch.uint8)
    expect = torch.tensor([2.0 ** (i - 127) for i in range(255)], dtype=torch.float64)
    assert torch.equal(decode_e8m0(b).double(), expect.float().double())
    # torch's own E8M0 dtype agrees bit for bit
    assert torch.equal(decode_e8m0(b), b.view(torch.float8_e8m0fnu).float())


def test_e2m1_round_trip_and_nearest_even():
    table = e2m1_table()
    assert torch.equal(decode_e2m1(round_e2m1(table)), table)
    # ties go to the even code: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0,
    # 5->4.0; past 6 saturates
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.3, -5.5, 0.26])
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -6.0, 0.5]
    assert decode_e2m1(round_e2m1(x)).tolist() == expect


def test_e2m1_rounding_is_nearest():
    x = torch.linspace(-7, 7, 2001)
    got = decode_e2m1(round_e2m1(x))
    table = e2m1_table()
    best = (x[:, None] - table[None, :]).abs().amin(dim=1)
    assert torch.all(((got - x).abs() <= best + 1e-7) | (x.abs() > 6))


def test_fp4_packing_order():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 2)  # (3, 32)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 16)
    assert packed[0, 0].item() == 0x10 and packed[0, 1].item() == 0x32  # even column low
    assert torch.equal(unpack_fp4(packed), codes)


def test_e4m3_saturates_and_round_trips():
    codes = torch.arange(256, dtype=torch.uint8)
    finite = codes[(codes & 0x7F) != 0x7F]
    values = finite.view(torch.float8_e4m3fn).float()
    assert torch.equal(round_e4m3(values).view(torch.uint8), finite)
    assert round_e4m3(torch.tensor([1e4, -600.0])).float().tolist() == [448.0, -448.0]


@pytest.mark.parametrize("granularity,scales_shape", [
    ("tensor", (1, 1)), ("channel", (130, 1)), ("block", (2, 3)),
])
def test_fp8_granularities(granularity, scales_shape):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(130, 300, generator=gen)  # neither divides 128
    q = quantize_fp8(w, granularity)
    assert q.codes.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.float32
    assert q.scales.shape == scales_shape and q.granularity == granularity
    assert q.nbytes == 130 * 300 + 4 * q.scales.numel()
    # E4M3 has 3 mantissa bits: relative error at most 2^-4 of each block's values
    err = (q.dequantize() - w).abs()
    assert torch.all(err <= w.abs() * 2.0**-4 + q.scales.max() * 2.0**-9)
    # every block's largest magnitude maps to 448 exactly
    assert q.codes.float().abs().max().item() == 448.0


def test_fp8_block_scales_layout():
    w = torch.ones(200, 260)
    w[128:, 256:] = 7.0  # the last tile (rows 128.., cols 256..)
    q = quantize_fp8(w, "block")
    assert q.scales.shape == (2, 3)
    assert q.scales[1, 2].item() == pytest.approx(7.0 / 448)
    assert q.scales[0, 0].item() == pytest.approx(1.0 / 448)
    assert torch.equal(q.dequantize(), w)  # 1 and 7 are representable


def test_fp8_representable_values_are_exact():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 126, (16, 64), generator=gen, dtype=torch.uint8)
    w = codes.view(torch.float8_e4m3fn).float() * 0.25
    w[0, 0] = 448 * 0.25  # the block maximum, so the scale is 0.25
    q = quantize_fp8(w, "tensor")
    assert torch.equal(q.dequantize(), w)


def test_mxfp4_scale_choice_and_round_trip():
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (4, 64), generator=gen, dtype=torch.uint8)
    codes[:, ::32] = 7  # each block's maximum is 6 = 1.5 * 2^2
    exps = torch.tensor([[-3, 0], [5, -10], [1, 1], [0, 7]])
    w = decode_e2m1(codes) * torch.exp2(exps.float()).repeat_interleave(32, dim=1)
    q = quantize_mxfp4(w)
    # shared exponent floor(log2(6 * 2^e)) - 2 = e
    assert torch.equal(mx_exponents(w), exps.int())
    assert torch.equal(q.scales, (exps + 127).to(torch.uint8))
    assert torch.equal(unpack_fp4(q.packed), codes)
    assert torch.equal(q.dequantize(), w)
    assert q.nbytes == 4 * 32 + 4 * 2


def test_mxfp4_saturates_like_the_spec():
    # max 7.5: exponent floor(log2 7.5) - 2 = 0, so 7.5 / 1 clamps to 6
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 7.5, 0.74
    out = quantize_mxfp4(w).dequantize()
    assert out[0, 0].item() == 6.0 and out[0, 1].item() == 0.5


def test_mxfp4_zero_block():
    q = quantize_mxfp4(torch.zeros(2, 32))
    assert q.scales.tolist() == [[0], [0]] and torch.equal(q.dequantize(), torch.zeros(2, 32))


def test_nvfp4_two_level_scales():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(8, 48, generator=gen)
    q = quantize_nvfp4(w)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (8, 3)
    assert q.global_scale.item() == pytest.approx(w.abs().max().item() / (448 * 6))
    assert q.nbytes == 8 * 24 + 8 * 3 + 4
    step = q.scales.float() * q.global_scale
    # each value lies within half an E2M1 step (at most 1.0 of the scaled range) of W
    err = (q.dequantize() - w).abs()
    assert torch.all(err <= step.repeat_interleave(16, dim=1) * 1.0 + 1e-6)


def test_nvfp4_representable_values_are_exact():
    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 16, (3, 32), generator=gen, dtype=torch.uint8)
    codes[:, ::16] = 7
    w = decode_e2m1(codes) * 0.5
    w[0, 0] = 6 * 448 * 0.5 / 448  # keep the global scale a power of two
    q = quantize_nvfp4(w)
    assert torch.equal(q.dequantize(), w)


def test_fake_quantized_activations():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 64, generator=gen)
    x8 = fake_quantize_fp8_rows(x)
    amax = x.abs().amax(dim=1, keepdim=True)
    assert torch.allclose(x8.abs().amax(dim=1, keepdim=True), amax)
    assert torch.all((x8 - x).abs() <= x.abs() * 2.0**-4 + amax / 448 * 2.0**-9)
    mx = fake_quantize_fp4_rows(x, "mxfp4")
    assert torch.equal(mx, quantize_mxfp4(x).dequantize())
    nv = fake_quantize_fp4_rows(x, "nvfp4")
    assert torch.equal(nv[1:2], quantize_nvfp4(x[1:2]).dequantize())  # one row, its own scale
    with pytest.raises(ValueError, match="mxfp4 or nvfp4"):
        fake_quantize_fp4_rows(x, "fp8")
