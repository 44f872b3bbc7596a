"""GGUF quantized blocks reinterpreted as infbench's stored formats, without a float copy.

`native_weight(data, type_name)` takes a tensor's raw bytes as the GGUF reader maps them,
(rows, bytes per row) uint8 with the blocks of each row in column order, and returns the
`Int4Weight` / `Int8Weight` of `kernels/quant_format.py`, or the `Mxfp4Weight` of
`kernels/fp_format.py`, holding the same values (block layouts: ggml's `ggml-common.h`,
gguf-py's `quants.py`):

    Q4_0  (18 B / 32)  fp16 d, 16 B nibbles           -> int4/32, min = -8 d
    Q4_1  (20 B / 32)  fp16 d, fp16 m, 16 B nibbles   -> int4/32, byte for byte
    Q8_0  (34 B / 32)  fp16 d, 32 int8                -> int8/32, byte for byte
    Q4_K (144 B / 256) fp16 d, fp16 dmin, 12 B of 6-bit (sc, m) x 8, 128 B nibbles
                       -> int4/32: scale = d sc, min = -dmin m, rounded to fp16
    Q6_K (210 B / 256) 128 B low nibbles, 64 B high 2 bits, 16 int8 sc, fp16 d
                       -> int8/16: q - 32 in -32..31, scale = d sc, rounded to fp16
    MXFP4 (17 B / 32)  E8M0 e, 16 B of E2M1 nibbles   -> mxfp4, byte e as the scale

Q4_0/Q4_1/Q8_0 and MXFP4 keep every bit.  ggml's MXFP4 block stores value j in the low
nibble and value j + 16 in the high nibble of byte j; infbench's mxfp4 (gpt-oss's
`_blocks` order) packs columns 2j, 2j + 1 into byte j, so the nibbles are re-paired
(each byte of the result is built from two bytes of the block, no code array is made).
Its codes are the OCP E2M1 codes and e the OCP E8M0 exponent: value = e2m1(code) *
2^(e - 127), as gguf-py's doubled table times 2^(e - 128) gives it.  e = 255 (NaN in
OCP MX) never comes out of a float quantizer and is refused.

The K-quants' two-level scales become one fp16 scale per sub-block: d * sc is exact in
float32 (11 + 8 bits) and rounds once to fp16, a relative error of at most 2^-11 of that
scale (`tests/model/test_gguf_kquants.py` measures it).
Only uint8 codes are unpacked along the way (Q4_K's nibbles are reordered; Q6_K's bits are
joined): the largest temporary is one byte per weight of one tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from kernels.fp_format import MX_BLOCK, Mxfp4Weight
from kernels.quant_format import Int4Weight, Int8Weight, pack_int4

QK = 32  # values per Q4_0 / Q4_1 / Q8_0 / MXFP4 block
QK_K = 256  # values per K-quant super-block
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q4_K": 144, "Q6_K": 210, "MXFP4": 17}
BLOCK_VALUES = {"Q4_0": QK, "Q4_1": QK, "Q8_0": QK, "Q4_K": QK_K, "Q6_K": QK_K, "MXFP4": QK}
E8M0_NAN = 255  # the one E8M0 byte that is no power of two
NativeWeight = Int4Weight | Int8Weight | Mxfp4Weight  # what a native GGUF tensor becomes


def _blocks(data: np.ndarray, type_name: str) -> tuple[np.ndarray, int, int]:
    """(rows, blocks per row, block bytes) view of a tensor's bytes, and its (N, K)."""
    rows = np.asarray(data).view(np.uint8)
    n = rows.shape[0]
    size = BLOCK_BYTES[type_name]
    if rows.ndim != 2 or rows.shape[1] % size:
        raise ValueError(f"{type_name} tensor bytes of shape {rows.shape} are not whole blocks")
    per_row = rows.shape[1] // size
    return rows.reshape(n, per_row, size), n, per_row * BLOCK_VALUES[type_name]


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 at byte `start` of every block: (N, B) float16."""
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0]


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def native_weight(data: np.ndarray, type_name: str) -> NativeWeight:
    """The stored format of a Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K / MXFP4 tensor's raw bytes."""
    blocks, n, k = _blocks(data, type_name)
    if type_name == "Q4_0":
        d = _f16(blocks, 0)
        mins = (d.astype(np.float32) * -8.0).astype(np.float16)  # exact: a power of two
        if not np.isfinite(mins).all():
            raise ValueError("a Q4_0 scale times -8 overflows fp16")
        return Int4Weight(_tensor(blocks[..., 2:].reshape(n, k // 2)), _tensor(d),
                          _tensor(mins), QK)
    if type_name == "Q4_1":
        return Int4Weight(_tensor(blocks[..., 4:].reshape(n, k // 2)), _tensor(_f16(blocks, 0)),
                          _tensor(_f16(blocks, 2)), QK)
    if type_name == "Q8_0":
        q = blocks[..., 2:].reshape(n, k).view(np.int8)
        return Int8Weight(_tensor(q), _tensor(_f16(blocks, 0)), QK)
    if type_name == "Q4_K":
        return _q4_k(blocks, n, k)
    if type_name == "Q6_K":
        return _q6_k(blocks, n, k)
    if type_name == "MXFP4":
        return _mxfp4(blocks, n, k)
    raise ValueError(f"{type_name} has no native format")


def q4_k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of eight 6-bit (sc, m) pairs -> sc, m: (..., 8) uint8 each.

    Bytes 0-3 hold sc 0-3 (low 6 bits) and the high 2 bits of sc 4-7; bytes 4-7 the same
    for m; bytes 8-11 the low 4 bits of sc 4-7 (low nibble) and of m 4-7 (high nibble)."""
    s = packed.reshape(*packed.shape[:-1], 3, 4)
    lo, mid, hi = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    m = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc, m


def _q4_k(blocks: np.ndarray, n: int, k: int) -> Int4Weight:
    d = _f16(blocks, 0).astype(np.float32)[..., None]  # (N, B, 1)
    dmin = _f16(blocks, 2).astype(np.float32)[..., None]
    sc, m = q4_k_scale_min(blocks[..., 4:16])  # (N, B, 8)
    scales = (d * sc).astype(np.float16).reshape(n, k // QK)
    mins = (-(dmin * m)).astype(np.float16).reshape(n, k // QK)
    # 4 chunks of 32 bytes per block: low nibbles are sub-block 2j, high nibbles 2j + 1.
    qs = blocks[..., 16:].reshape(n, k // QK_K, 4, 1, QK)
    codes = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F  # (N,B,4,2,32)
    packed = pack_int4(_tensor(codes.reshape(n, k)))  # -> infbench's order (low: j, high: j+16)
    return Int4Weight(packed, _tensor(scales), _tensor(mins), QK)


def _q6_k(blocks: np.ndarray, n: int, k: int) -> Int8Weight:
    nb = k // QK_K
    # Per 128-value half: ql's 64 bytes give values 0-63 (low nibbles) and 64-127 (high);
    # qh's 32 bytes give 2 high bits of values j, j+32, j+64, j+96 (shifts 0, 2, 4, 6).
    low = blocks[..., :128].reshape(n, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(
        1, 1, 1, 2, 1)
    high = blocks[..., 128:192].reshape(n, nb, 2, 1, 32) >> np.array(
        [0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    codes = (low & 0x0F).reshape(n, nb, 8, 32) | ((high & 0x03).reshape(n, nb, 8, 32) << 4)
    q = (codes.astype(np.int16) - 32).astype(np.int8).reshape(n, k)  # 0..63 -> -32..31
    sc = blocks[..., 192:208].view(np.int8).astype(np.float32)  # (N, B, 16)
    d = _f16(blocks, 208).astype(np.float32)[..., None]
    scales = (d * sc).astype(np.float16).reshape(n, k // 16)
    return Int8Weight(_tensor(q), _tensor(scales), 16)


def check_mxfp4_scales(data: np.ndarray) -> None:
    """ValueError when an MXFP4 tensor's raw bytes hold an E8M0 scale of 255 (NaN)."""
    blocks, _, _ = _blocks(data, "MXFP4")
    bad = int(np.count_nonzero(blocks[..., 0] == E8M0_NAN))
    if bad:
        raise ValueError(f"{bad} MXFP4 block(s) with E8M0 scale byte {E8M0_NAN} (NaN); "
                         "allowed: 0..254")


def _mxfp4(blocks: np.ndarray, n: int, k: int) -> Mxfp4Weight:
    check_mxfp4_scales(blocks.reshape(n, -1))
    qs = blocks[..., 1:]  # (N, B, 16): byte j = value j (low nibble) | value j + 16 (high)
    even, odd = qs[..., 0::2], qs[..., 1::2]  # the bytes holding values (2i, 2i+1), (2i+16, ..)
    low = (even & 0x0F) | ((odd & 0x0F) << 4)  # bytes 0..7: columns 2i, 2i + 1
    high = (even >> 4) | (odd & 0xF0)  # bytes 8..15: columns 16 + 2i, 16 + 2i + 1
    packed = np.concatenate([low, high], axis=-1).reshape(n, k // 2)
    return Mxfp4Weight(_tensor(packed), _tensor(blocks[..., 0].reshape(n, k // MX_BLOCK)))


# ---------------------------------------------------------------- formats as row tensors
def format_parts(weight: NativeWeight) -> list[torch.Tensor]:
    """The tensors of a stored format, each with one row per output feature."""
    if isinstance(weight, Int8Weight):
        return [weight.q, weight.scales]
    if isinstance(weight, Mxfp4Weight):
        return [weight.packed, weight.scales]
    return [weight.packed, weight.scales, weight.mins]


def format_name(weight: NativeWeight) -> str:
    """`int4/32`, `int8/16`, `mxfp4`: the `core/gguf_types.py` name of a stored format."""
    if isinstance(weight, Mxfp4Weight):
        return "mxfp4"
    kind = "int8" if isinstance(weight, Int8Weight) else "int4"
    return f"{kind}/{weight.group_size}"


def map_rows(weight: NativeWeight, fn: Callable[[torch.Tensor], torch.Tensor]) -> NativeWeight:
    """`fn` (a row reordering) applied to every part of a stored format alike."""
    parts = [fn(t) for t in format_parts(weight)]
    if isinstance(weight, Int8Weight):
        return Int8Weight(parts[0], parts[1], weight.group_size)
    if isinstance(weight, Mxfp4Weight):
        return Mxfp4Weight(parts[0], parts[1])
    return Int4Weight(parts[0], parts[1], parts[2], weight.group_size)


def empty_format(fmt: str, out_features: int, in_features: int,
                 device: str | torch.device) -> NativeWeight:
    """An uninitialized `int4/G`, `int8/G` or `mxfp4` weight (`core/gguf_types.py` names)."""
    if fmt == "mxfp4":
        return Mxfp4Weight(
            torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device),
            torch.empty(out_features, in_features // MX_BLOCK, dtype=torch.uint8, device=device))
    kind, group = fmt.split("/")
    g = int(group)
    scales = torch.empty(out_features, in_features // g, dtype=torch.float16, device=device)
    if kind == "int8":
        q = torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        return Int8Weight(q, scales, g)
    packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
    return Int4Weight(packed, scales, torch.empty_like(scales), g)
