"""The one stored format of quantized weights (kernels/quant_format.py): round trips within
the format's error bound, the int4 packing and its compatibility with GGUF's Q4_1 blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.quant_format import (
    BLOCK,
    Int4Weight,
    Int8Weight,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

FP16_EPS = 2.0**-11  # unit roundoff of float16: scales and mins are stored in it


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    w[0, :] = 0.0  # an all-zero row: scale clamps, dequantize stays exactly 0
    w[1, 3] = 40.0  # an outlier widens its group
    return w


def _per_column(t: torch.Tensor, group_size: int) -> torch.Tensor:
    return t.float().repeat_interleave(group_size, dim=1)  # (N, G) -> (N, K)


@pytest.mark.parametrize("group_size", [None, 32, 64, 128], ids=["row", "g32", "g64", "g128"])
def test_int8_round_trip_within_half_a_step(group_size):
    w = _weights(12, 256)
    qw = quantize_int8(w, group_size)
    g = 256 if group_size is None else group_size
    assert qw.q.dtype == torch.int8 and qw.q.shape == (12, 256) and qw.group_size == g
    assert qw.scales.dtype == torch.float16 and qw.scales.shape == (12, 256 // g)
    assert qw.nbytes == 12 * 256 + 12 * (256 // g) * 2
    assert int(qw.q.abs().max()) <= 127
    scale = _per_column(qw.scales, g)
    err = (w - qw.dequantize()).abs()
    # Half a step: storing the scale in fp16 moves the clamped extreme by at most
    # 127 * scale * 2^-11, well inside it.
    assert (err <= scale / 2 * (1 + 1e-6)).all()
    assert torch.equal(qw.dequantize()[0], torch.zeros(256))


@pytest.mark.parametrize("group_size", [32, 64, 128], ids=["g32", "g64", "g128"])
def test_int4_round_trip_within_half_a_step(group_size):
    w = _weights(12, 256)
    w[2] = 100.0 + 0.01 * w[2]  # a narrow range far from 0: the fp16 min is off by > 1 step
    qw = quantize_int4(w, group_size)
    assert qw.packed.dtype == torch.uint8 and qw.packed.shape == (12, 128)
    assert qw.scales.dtype == qw.mins.dtype == torch.float16
    assert qw.scales.shape == qw.mins.shape == (12, 256 // group_size)
    assert qw.nbytes == 12 * 128 + 2 * 12 * (256 // group_size) * 2
    codes = qw.codes()
    assert codes.shape == (12, 256) and int(codes.max()) <= 15
    scale = _per_column(qw.scales, group_size)
    mins = _per_column(qw.mins, group_size)
    err = (w - qw.dequantize()).abs()
    # Half a step, plus the fp16 rounding of the stored min (codes clamp to 0..15, so the
    # shifted grid cannot follow it past the ends of the group).
    assert (err <= scale / 2 + mins.abs() * FP16_EPS + 1e-6).all()
    assert (err[2] > scale[2] / 2).any()  # that term is needed, not just tidy
    # Every group's min is representable to fp16 precision: its smallest weight comes back.
    wg = w.view(12, -1, group_size)
    assert torch.allclose(qw.mins.float(), wg.amin(dim=2), rtol=FP16_EPS, atol=1e-7)
    assert torch.equal(qw.dequantize()[0], torch.zeros(256))


def test_int4_round_trip_is_exact_on_the_grid():
    """Weights already on a group's grid (fp16-exact scale and min) come back unchanged."""
    gen = torch.Generator().manual_seed(1)
    n, k, g = 6, 128, 32
    codes = torch.randint(0, 16, (n, k), generator=gen)
    codes[:, ::g] = 0
    codes[:, 1::g] = 15  # each group spans the full 0..15
    scale = torch.tensor([0.25, 0.5, 0.125, 1.0, 0.0625, 2.0])[:, None, None]
    mins = torch.tensor([-1.0, -2.0, 0.5, -8.0, 0.0, -3.0])[:, None, None]
    w = (codes.view(n, k // g, g).float() * scale + mins).view(n, k)
    qw = quantize_int4(w, g)
    assert torch.equal(qw.codes(), codes.to(torch.uint8))
    assert torch.equal(qw.dequantize(), w)


def test_pack_unpack_are_inverse():
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (7, 96), generator=gen, dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (7, 48) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    raw = torch.randint(0, 256, (7, 48), generator=gen, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(raw)), raw)


def test_pack_order_is_ggufs():
    """Byte j of each 32-column block: column j in the low nibble, column j + 16 high."""
    k = 64
    codes = (torch.arange(k) % 16).to(torch.uint8)[None, :]  # column c holds c % 16
    codes = torch.where(torch.arange(k) % 32 >= 16, 15 - codes, codes)
    packed = pack_int4(codes)[0]
    for c in range(k):
        byte = int(packed[(c // BLOCK) * 16 + c % 16])
        nibble = byte >> 4 if c % BLOCK >= 16 else byte & 0xF
        assert nibble == int(codes[0, c]), c


def _to_q4_1_bytes(qw: Int4Weight) -> np.ndarray:
    """Int4Weight with group 32 -> GGUF Q4_1 blocks (fp16 d, fp16 m, 16 bytes qs) per row."""
    n, k = qw.shape
    d = qw.scales.numpy().view(np.uint8).reshape(n, k // 32, 2)
    m = qw.mins.numpy().view(np.uint8).reshape(n, k // 32, 2)
    qs = qw.packed.numpy().reshape(n, k // 32, 16)
    return np.concatenate([d, m, qs], axis=-1).reshape(n, -1)


def test_q4_1_compatible_both_ways():
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as T

    w = _weights(8, 128)
    # Our format read as Q4_1 blocks dequantizes (by gguf) to our dequantize().
    qw = quantize_int4(w, 32)
    theirs = quants.dequantize(_to_q4_1_bytes(qw), T.Q4_1)
    assert np.array_equal(theirs, qw.dequantize().numpy())
    # gguf's Q4_1 blocks taken apart into our fields dequantize to gguf's values.
    blocks = quants.quantize(w.numpy(), T.Q4_1).reshape(8, 128 // 32, 20)
    ours = Int4Weight(
        packed=torch.from_numpy(blocks[..., 4:].reshape(8, 64).copy()),
        scales=torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).reshape(8, 4)),
        mins=torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).reshape(8, 4)),
        group_size=32)
    ref = quants.dequantize(blocks.reshape(8, -1), T.Q4_1)
    assert np.array_equal(ours.dequantize().numpy(), ref)


def test_int8_group_32_is_q8_0():
    """Q8_0 blocks (fp16 d, 32 int8) are Int8Weight with group 32."""
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as T

    w = _weights(4, 96)
    blocks = quants.quantize(w.numpy(), T.Q8_0).reshape(4, 3, 34)
    ours = Int8Weight(
        q=torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(4, 96)),
        scales=torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).reshape(4, 3)),
        group_size=32)
    assert np.array_equal(ours.dequantize().numpy(), quants.dequantize(blocks.reshape(4, -1),
                                                                        T.Q8_0))


@pytest.mark.parametrize(("fn", "group_size"), [(quantize_int4, 48), (quantize_int4, 100),
                                                (quantize_int8, 100)])
def test_bad_group_sizes_raise(fn, group_size):
    with pytest.raises(ValueError, match="group_size"):
        fn(torch.randn(4, 256), group_size)
