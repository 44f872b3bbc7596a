"""How infbench stores quantized weights: one layout for every backend (C++ CPU, Triton,
torch reference) and for GGUF files run natively.

int8 (`Int8Weight`): symmetric, W[n, k] ~= q[n, k] * scales[n, k // group_size], q in
  -127..127 (int8), scales float16.  group_size = K is one scale per output channel (the
  `quant.weights: int8` default); group_size = 32 is GGUF's Q8_0.

int4 (`Int4Weight`): W[n, k] ~= q[n, k] * scales[n, g] + mins[n, g] with g = k // group_size,
  q in 0..15, scales and mins float16: GGUF's Q4_1 layout (Q4_0 is mins = -8 * scales).
  Round to nearest (RTN) takes each group's min and (max - min) / 15.  The nibbles are packed
  in blocks of 32 columns as GGUF packs them: byte j of a block holds column j in its low
  nibble and column j + 16 in its high nibble (so one 16-byte load gives 32 weights as two
  16-wide halves).  group_size is a multiple of 32.

Both store every byte they need and nothing else, so `nbytes` is what the model holds and
what `QuantConfig.weight_bits` prices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 32  # int4 packing block (columns)
INT4_GROUP_SIZES = (32, 64, 128)


@dataclass
class Int8Weight:
    q: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N, K // group_size) float16
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 2

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32."""
        n, k = self.shape
        q = self.q.float().view(n, k // self.group_size, self.group_size)
        return (q * self.scales.float()[..., None]).view(n, k)


@dataclass
class Int4Weight:
    packed: torch.Tensor  # (N, K // 2) uint8, GGUF nibble order within blocks of 32
    scales: torch.Tensor  # (N, K // group_size) float16
    mins: torch.Tensor  # (N, K // group_size) float16
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.packed.shape[0]), int(self.packed.shape[1]) * 2

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + (self.scales.numel() + self.mins.numel()) * 2

    def codes(self) -> torch.Tensor:
        """(N, K) uint8 in 0..15."""
        return unpack_int4(self.packed)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32."""
        n, k = self.shape
        q = self.codes().float().view(n, k // self.group_size, self.group_size)
        w = q * self.scales.float()[..., None] + self.mins.float()[..., None]
        return w.view(n, k)


ACT_BLOCK = 32  # int8 activations: columns per scale


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """`quant.activations: int8`, as values: each ACT_BLOCK-column block of each row (the
    last one shorter when ACT_BLOCK does not divide K) rounded to int8 codes
    round(x * (127 / max|x|)) times its scale max|x| / 127, in float32 (the same arithmetic as
    the C++ kernels, `kernels/csrc/linear_q8act.cpp`, so their products agree to float
    rounding).  llama.cpp's Q8_0/Q8_1 activations have the same blocks and rounding."""
    xf = x.float()
    k = xf.shape[-1]
    pad = (-k) % ACT_BLOCK
    blocks = F.pad(xf, (0, pad)).view(*xf.shape[:-1], -1, ACT_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # torch.div, not `127.0 / amax`: a float over a tensor is reciprocal(amax) * 127, which
    # rounds differently from the C++ 127.f / amax and moves codes that sit near a tie
    inv = torch.where(amax > 0, torch.div(torch.full_like(amax, 127.0), amax),
                      torch.zeros_like(amax))
    codes = torch.round(blocks * inv).clamp(-127, 127)
    out = (codes * (amax / 127.0)).view(*xf.shape[:-1], k + pad)
    return out[..., :k]


def check_int8_shape(n: int, k: int, group_size: int) -> None:
    if group_size <= 0 or k % group_size:
        raise ValueError(f"int8 group_size {group_size} does not divide the input dimension {k}")


def check_int4_shape(n: int, k: int, group_size: int) -> None:
    if group_size % BLOCK or group_size <= 0:
        raise ValueError(f"int4 group_size must be a multiple of {BLOCK}, got {group_size}")
    if k % group_size:
        raise ValueError(f"int4 group_size {group_size} does not divide the input dimension {k}")


def quantize_int8(w: torch.Tensor, group_size: int | None = None) -> Int8Weight:
    """Round to nearest, symmetric: scale = max|w| / 127 per group (per row when None)."""
    n, k = w.shape
    g = k if group_size is None else group_size
    check_int8_shape(n, k, g)
    wg = w.detach().float().view(n, k // g, g)
    scales = (wg.abs().amax(dim=2) / 127.0).clamp(min=1e-10).half()  # (N, G)
    q = torch.round(wg / scales.float()[..., None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q.view(n, k).contiguous(), scales.contiguous(), g)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes in 0..15 -> (N, K // 2) uint8 in the GGUF block order (K % 32 == 0)."""
    n, k = codes.shape
    c = codes.to(torch.uint8).view(n, k // BLOCK, 2, BLOCK // 2)  # (N, B, half, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: (N, K // 2) uint8 -> (N, K) uint8 codes."""
    n, half = packed.shape
    p = packed.view(n, half // (BLOCK // 2), BLOCK // 2)  # (N, B, 16)
    return torch.stack([p & 0xF, p >> 4], dim=2).reshape(n, half * 2)


def quantize_int4(w: torch.Tensor, group_size: int = 128,
                  input_scales: torch.Tensor | None = None) -> Int4Weight:
    """Round to nearest, asymmetric: per group min and (max - min) / 15.

    input_scales (K,), if given, multiplies the columns first (AWQ: the caller divides the
    activations by the same scales)."""
    n, k = w.shape
    check_int4_shape(n, k, group_size)
    wf = w.detach().float()
    if input_scales is not None:
        wf = wf * input_scales.float()[None, :]
    wg = wf.view(n, k // group_size, group_size)
    lo, hi = wg.amin(dim=2), wg.amax(dim=2)
    scales = ((hi - lo) / 15.0).clamp(min=1e-10).half()
    mins = lo.half()
    s, m = scales.float()[..., None], mins.float()[..., None]
    codes = torch.round((wg - m) / s).clamp(0, 15).to(torch.uint8).view(n, k)
    return Int4Weight(pack_int4(codes), scales.contiguous(), mins.contiguous(), group_size)
