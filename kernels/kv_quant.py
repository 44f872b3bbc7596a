"""How infbench stores a quantized KV cache: one format for every backend.

A quantized cache keeps the paged layout of the float one, (num_blocks, block_size, Hkv,
D), with one-byte values, plus one float32 scale per token per KV head beside each of the
K and V pools, (num_blocks, block_size, Hkv):

    scale = max |x| over the head_dim values of one token of one head / QMAX
    q     = round(x / scale)   int8: half to even, clamped to +-127 (QMAX 127)
                               fp8:  cast to float8_e4m3fn, round to nearest even (QMAX 448)
    x    ~= q * scale          an all-zero row has scale 0 and q 0

Symmetric (no zero point): keys and values of one head are centred closely enough on 0
that a zero point buys little, and it keeps dequantization one multiply, which the
attention kernels fold into the score of a key (K) and the softmax weight of a value (V)
instead of rescaling head_dim values.  Scales are float32, not float16: 4 bytes per row
of head_dim values instead of 2 (SmolLM2's head_dim 64: 68 bytes per row instead of 66,
3% more), and no overflow or subnormal rounding to think about for any activation.

The division and the rounding are spelled the same in the torch reference, the Triton
kernel and the C++ kernel (an IEEE division, then round half to even), so the three store
identical bytes.  `QuantConfig.kv_bytes` / `kv_scale_bytes` price exactly this layout.
"""

from __future__ import annotations

import torch

# model.quant.kv -> the cache's storage dtype.
KV_QUANT_DTYPES: dict[str, torch.dtype] = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
SCALE_DTYPE = torch.float32
# Largest magnitude a stored value may take: int8's symmetric range, e4m3's largest finite.
QMAX: dict[torch.dtype, float] = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def is_quantized(cache: torch.Tensor) -> bool:
    """Whether a cache tensor holds quantized values (and so needs scales beside it)."""
    return cache.dtype in QMAX


def quantize_kv_ref(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) -> (q (..., D) in `dtype`, scale (...) float32), one scale per row of D."""
    assert dtype in QMAX, f"KV quantization stores int8 or float8_e4m3fn, not {dtype}"
    qmax = QMAX[dtype]
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / qmax  # (...)
    y = xf / torch.where(scale == 0, torch.ones_like(scale), scale)[..., None]
    if dtype == torch.int8:
        q = torch.round(y).clamp_(-qmax, qmax).to(torch.int8)
    else:
        q = y.clamp_(-qmax, qmax).to(dtype)
    return q, scale


def dequantize_kv_ref(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q (..., D) with scale (...) -> float32 (..., D)."""
    return q.float() * scale.float()[..., None]


def check_scales(cache: torch.Tensor, scales: torch.Tensor | None, name: str) -> None:
    """A quantized cache comes with its (num_blocks, block_size, Hkv) float32 scales; a
    float cache with none."""
    if not is_quantized(cache):
        assert scales is None, f"{name}: a {cache.dtype} cache takes no scales"
        return
    assert scales is not None, f"{name}: a {cache.dtype} cache needs its scales"
    assert scales.dtype == SCALE_DTYPE and scales.shape == cache.shape[:3], (
        name, scales.dtype, tuple(scales.shape), tuple(cache.shape))
