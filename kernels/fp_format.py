"""Low-precision float weights stored as checkpoints store them: FP8 (E4M3), MXFP4 and NVFP4.

fp8 (`Fp8Weight`): codes (N, K) float8_e4m3fn and float32 scales, W[n, k] = codes[n, k] *
  scales[n // block_n, k // block_k].  One layout covers the three granularities
  (`FP8_SCALES`): `tensor` is one block of (N, K) (scales (1, 1)), `channel` one block per
  row (block (1, K), scales (N, 1)), `block` DeepSeek-V3's 128x128 tiles (scales
  (ceil(N/128), ceil(K/128)), its `weight_scale_inv`, which despite the name multiplies the
  codes).  Quantizing: scale = max|W| / 448 per block, codes = W / scale rounded to nearest
  even E4M3 (torch's cast, after a clamp to +-448).

mxfp4 (`Mxfp4Weight`, OCP Microscaling v1.0): E2M1 codes, two per byte (the even column in
  the low nibble: gpt-oss's `_blocks` byte order), and one E8M0 scale byte per 32 columns,
  W = e2m1(code) * 2^(scale - 127).  Quantizing follows the spec's conversion: the shared
  exponent is floor(log2(max|block|)) - 2 (2 = emax of E2M1), clamped to the E8M0 range;
  each value / 2^exponent is rounded to nearest even E2M1 and saturated at +-6.

nvfp4 (`Nvfp4Weight`, NVIDIA ModelOpt's layout): the same packed E2M1 codes, one E4M3
  scale per 16 columns and one float32 per-tensor scale, W = e2m1(code) * scale * global.
  Quantizing: global = max|W| / (448 * 6), scale = max|block| / 6 / global rounded to E4M3,
  codes = W / (scale * global) rounded to nearest even E2M1.

Every format stores exactly its bytes (`nbytes`), which `QuantConfig.weight_bits` prices;
`dequantize` is the exact float32 reference, `dequantize_rows` the same for a slice of rows
(the CPU path multiplies a few rows at a time, never the whole matrix in float).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_EMAX = 2  # 6 = 1.5 * 2^2
E8M0_BIAS = 127
MX_BLOCK = 32  # columns per E8M0 scale
NV_BLOCK = 16  # columns per E4M3 scale
FP8_BLOCK = 128  # DeepSeek-V3's weight_block_size
FP8_SCALES = ("tensor", "channel", "block")
# The eight E2M1 magnitudes, code 0..7 (sign is bit 3): OCP MX v1.0, table 5
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round to nearest even E2M1: a magnitude above (or at, when the upper code is even) each
# midpoint moves one code up.  (midpoint, whether a tie goes up)
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
               (3.5, True), (5.0, False))


def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """(16,) float32: the value of every 4-bit E2M1 code (codes 8..15 negative)."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x (float) -> uint8 E2M1 codes, round to nearest even, saturating at +-6."""
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for mid, tie_up in _E2M1_STEPS:
        code += (mag >= mid if tie_up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)  # -0.0 keeps its sign bit


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 -> float32 values."""
    return e2m1_table(codes.device)[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) codes 0..15 -> (..., K // 2) uint8, column 2j in the low nibble of byte j."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_fp4: (..., K // 2) uint8 -> (..., K) uint8 codes."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def decode_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 bytes -> float32 2^(byte - 127) (255, the NaN code, is never stored)."""
    return torch.exp2(scales.float() - E8M0_BIAS)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn, nearest even, saturating at +-448 (torch alone would give NaN
    above 464)."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _expand(scales: torch.Tensor, block: int, cols: int) -> torch.Tensor:
    """(R, G) per-block scales -> (R, cols): each repeated over its `block` columns."""
    return scales.repeat_interleave(block, dim=-1)[..., :cols]


# ---------------------------------------------------------------------------------- fp8
@dataclass
class Fp8Weight:
    codes: torch.Tensor  # (N, K) float8_e4m3fn
    scales: torch.Tensor  # (ceil(N / block_n), ceil(K / block_k)) float32, multiplied
    block_n: int
    block_k: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.scales.numel() * 4

    @property
    def granularity(self) -> str:
        """`tensor`, `channel` or `block` (FP8_SCALES)."""
        if self.block_n == 1 and self.block_k >= self.shape[1]:
            return "channel"
        return "tensor" if (self.block_n, self.block_k) == self.shape else "block"

    def dequantize_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of W as (stop - start, K) float32."""
        k = self.shape[1]
        rows = torch.arange(start, stop, device=self.codes.device) // self.block_n
        s = _expand(self.scales.float().index_select(0, rows), self.block_k, k)
        return self.codes[start:stop].float() * s

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32."""
        return self.dequantize_rows(0, self.shape[0])


def fp8_block_shape(n: int, k: int, granularity: str) -> tuple[int, int]:
    """(block_n, block_k) of one scale for a (N, K) matrix."""
    if granularity == "tensor":
        return n, k
    if granularity == "channel":
        return 1, k
    if granularity == "block":
        return FP8_BLOCK, FP8_BLOCK
    raise ValueError(f"fp8 scales {granularity!r}; allowed: {', '.join(FP8_SCALES)}")


def quantize_fp8(w: torch.Tensor, granularity: str = "channel") -> Fp8Weight:
    """W (N, K) -> E4M3 codes with one float32 scale per block (max|block| / 448)."""
    n, k = w.shape
    bn, bk = fp8_block_shape(n, k, granularity)
    gn, gk = -(-n // bn), -(-k // bk)
    wf = w.detach().float()
    padded = torch.zeros(gn * bn, gk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = wf.abs()
    amax = padded.view(gn, bn, gk, bk).amax(dim=(1, 3))  # (gn, gk)
    scales = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    full = _expand(scales.repeat_interleave(bn, dim=0)[:n], bk, k)  # (N, K)
    return Fp8Weight(round_e4m3(wf / full), scales.contiguous(), bn, bk)


# -------------------------------------------------------------------------------- mxfp4
@dataclass
class Mxfp4Weight:
    packed: torch.Tensor  # (N, K // 2) uint8, E2M1 pairs (even column low)
    scales: torch.Tensor  # (N, K // 32) uint8, E8M0

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.packed.shape[0]), int(self.packed.shape[1]) * 2

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel()

    def dequantize_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of W as (stop - start, K) float32."""
        values = decode_e2m1(unpack_fp4(self.packed[start:stop]))
        return values * _expand(decode_e8m0(self.scales[start:stop]), MX_BLOCK, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32."""
        return self.dequantize_rows(0, self.shape[0])


def check_fp4_shape(fmt: str, n: int, k: int) -> None:
    block = MX_BLOCK if fmt == "mxfp4" else NV_BLOCK
    if k % block:
        raise ValueError(f"{fmt} stores one scale per {block} input columns; the input "
                         f"dimension {k} of a {n}x{k} projection is not a multiple of {block}")


def mx_exponents(w: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (N, K // 32) int32 shared exponents floor(log2(max|block|)) - 2, in the
    E8M0 range -127..127 (an all-zero block gets -127)."""
    n, k = w.shape
    amax = w.detach().float().abs().view(n, k // MX_BLOCK, MX_BLOCK).amax(dim=2)
    # frexp: amax = m * 2^e with m in [0.5, 1), so floor(log2(amax)) = e - 1, exactly
    _, exp = torch.frexp(amax)
    shared = torch.where(amax > 0, exp.int() - 1 - E2M1_EMAX, torch.full_like(exp, -127))
    return shared.clamp(-E8M0_BIAS, E8M0_BIAS).int()


def quantize_mxfp4(w: torch.Tensor) -> Mxfp4Weight:
    """W (N, K), K a multiple of 32 -> packed E2M1 codes and E8M0 scales (OCP MX v1.0)."""
    n, k = w.shape
    check_fp4_shape("mxfp4", n, k)
    shared = mx_exponents(w)  # (N, K // 32)
    scaled = w.detach().float() * _expand(torch.exp2(-shared.float()), MX_BLOCK, k)
    codes = round_e2m1(scaled)
    return Mxfp4Weight(pack_fp4(codes), (shared + E8M0_BIAS).to(torch.uint8).contiguous())


# -------------------------------------------------------------------------------- nvfp4
@dataclass
class Nvfp4Weight:
    packed: torch.Tensor  # (N, K // 2) uint8, E2M1 pairs (even column low)
    scales: torch.Tensor  # (N, K // 16) float8_e4m3fn
    global_scale: torch.Tensor  # () float32, multiplied

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.packed.shape[0]), int(self.packed.shape[1]) * 2

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() + 4

    def dequantize_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of W as (stop - start, K) float32."""
        values = decode_e2m1(unpack_fp4(self.packed[start:stop]))
        scales = self.scales[start:stop].float() * self.global_scale.float()
        return values * _expand(scales, NV_BLOCK, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32."""
        return self.dequantize_rows(0, self.shape[0])


def _nvfp4_parts(wf: torch.Tensor, global_scale: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """wf (N, K) float32 and a global scale () or (N, 1) -> (codes (N, K) uint8, E4M3
    block scales (N, K // 16))."""
    n, k = wf.shape
    block_amax = wf.abs().view(n, k // NV_BLOCK, NV_BLOCK).amax(dim=2)
    scales = round_e4m3(block_amax / E2M1_MAX / global_scale)  # (N, K // 16)
    step = _expand(scales.float() * global_scale, NV_BLOCK, k)  # (N, K)
    return round_e2m1(torch.where(step > 0, wf / step, torch.zeros_like(wf))), scales


def _nvfp4_global(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), torch.ones_like(amax))


def quantize_nvfp4(w: torch.Tensor) -> Nvfp4Weight:
    """W (N, K), K a multiple of 16 -> packed E2M1 codes, E4M3 block scales and a float32
    per-tensor scale (two-level, as ModelOpt's NVFP4)."""
    n, k = w.shape
    check_fp4_shape("nvfp4", n, k)
    wf = w.detach().float()
    global_scale = _nvfp4_global(wf.abs().max())
    codes, scales = _nvfp4_parts(wf, global_scale)
    return Nvfp4Weight(pack_fp4(codes), scales.contiguous(), global_scale.reshape(()))


# ---------------------------------------------------------------------- activations
def fake_quantize_fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """`quant.activations: fp8` as values: each row rounded to E4M3 with its own dynamic
    scale max|row| / 448 (per-token, as W8A8 FP8 serving scales activations), float32."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return round_e4m3(xf / scale).float() * scale


def fake_quantize_fp4_rows(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """`quant.activations: fp4` as values: each row quantized in the weights' own block
    format (mxfp4: E8M0 per 32 columns; nvfp4: E4M3 per 16 columns and the row's own
    global scale) and dequantized, float32."""
    rows = x.reshape(-1, x.shape[-1]).float()
    if fmt == "mxfp4":
        out = quantize_mxfp4(rows).dequantize()
    elif fmt == "nvfp4":
        global_scale = _nvfp4_global(rows.abs().amax(dim=1, keepdim=True))  # (M, 1)
        codes, scales = _nvfp4_parts(rows, global_scale)
        step = _expand(scales.float() * global_scale, NV_BLOCK, rows.shape[1])
        out = decode_e2m1(codes) * step
    else:
        raise ValueError(f"fp4 activations need mxfp4 or nvfp4 weights, not {fmt!r}")
    return out.view(x.shape)


FloatQuantWeight = Fp8Weight | Mxfp4Weight | Nvfp4Weight


def quantize_float_format(w: torch.Tensor, fmt: str, fp8_scales: str = "channel"
                          ) -> FloatQuantWeight:
    """`quant.weights` fp8 / mxfp4 / nvfp4 of one (N, K) matrix."""
    if fmt == "fp8":
        return quantize_fp8(w, fp8_scales)
    if fmt == "mxfp4":
        return quantize_mxfp4(w)
    if fmt == "nvfp4":
        return quantize_nvfp4(w)
    raise ValueError(f"{fmt!r} is not a float weight format; allowed: fp8, mxfp4, nvfp4")
