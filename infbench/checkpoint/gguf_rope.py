"""Llama 3.1's RoPE scaling read back from a GGUF's `rope_freqs.weight` (no torch).

llama.cpp's converter does not write Llama 3.1's `rope_scaling` (rope_type "llama3":
factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) as metadata;
it writes one factor per rotary frequency, `rope_freqs.weight` (head_dim / 2 float32), and
llama.cpp divides frequency i by factor i.  For llama3 scaling the factors are

    1                              wavelength < original / high_freq_factor
    factor                         wavelength > original / low_freq_factor
    1 / ((1 - s) / factor + s)     between, s = (original / wavelength - low) / (high - low)

with wavelength = 2 pi / frequency.  `llama3_scaling` recovers the four numbers, so the
engine's `layers.rope_inv_freq` (which follows transformers' llama3 rope) runs the file's
frequencies, and checks that they reproduce every factor of the file.  Only the ratios
original / low and original / high enter the frequencies, so `original` is taken from
`rope.scaling.original_context_length` when the file has it and else 8192 (the
converter's default, Llama 3's pre-training context); low and high follow from the factors:
s is linear in 1 / wavelength, fitted through the blended entries, or pinned at the last
unscaled (s = 1) or the first fully scaled (s = 0) entry where fewer than two are blended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DEFAULT_ORIGINAL_CONTEXT = 8192
_RTOL = 1e-5  # the file stores float32 factors


def llama3_factors(inv_freq: Sequence[float], factor: float, low: float, high: float,
                   original: float) -> list[float]:
    """The per-frequency divisors llama3 scaling applies (what the converter writes)."""
    out = []
    for f in inv_freq:
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            s = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return out


def rope_inv_freq_f32(head_dim: int, theta: float) -> list[float]:
    """theta^(-2i / head_dim), rounded to float32 as transformers computes them."""
    import struct

    def f32(x: float) -> float:
        return float(struct.unpack("f", struct.pack("f", x))[0])

    return [f32(1.0 / f32(theta ** f32(i / head_dim))) for i in range(0, head_dim, 2)]


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of s against x = original / wavelength."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    ms = sum(s for _, s in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        raise ValueError("the blended factors do not determine low/high_freq_factor")
    slope = sum((x - mx) * (s - ms) for x, s in points) / var
    return slope, ms - slope * mx


def llama3_scaling(factors: Sequence[float], head_dim: int, theta: float,
                   original: int | None) -> tuple[tuple[str, Any], ...] | None:
    """`ModelConfig.rope_scaling` items (rope_type llama3) whose frequencies divide the plain
    ones by `factors`; None when every factor is 1.  ValueError, saying why, when the
    factors are not llama3's."""
    if len(factors) != head_dim // 2:
        raise ValueError(f"rope_freqs.weight has {len(factors)} factors; the rotary "
                         f"dimension {head_dim} needs {head_dim // 2}")
    if all(f == 1.0 for f in factors):
        return None
    old = float(original or DEFAULT_ORIGINAL_CONTEXT)
    inv_freq = rope_inv_freq_f32(head_dim, theta)
    factor = max(factors)
    if factor <= 1.0 or min(factors) < 1.0 - _RTOL:
        raise ValueError("llama3 factors run from 1 (short wavelengths) up to the scaling "
                         f"factor; the file's run from {min(factors):g} to {factor:g}")
    xs = [old * f / (2 * math.pi) for f in inv_freq]  # original / wavelength
    ones = [x for x, f in zip(xs, factors, strict=True) if abs(f - 1.0) <= _RTOL]
    full = [x for x, f in zip(xs, factors, strict=True) if abs(f - factor) <= _RTOL * factor]
    points = [(x, (1 / f - 1 / factor) / (1 - 1 / factor))
              for x, f in zip(xs, factors, strict=True)
              if abs(f - 1.0) > _RTOL and abs(f - factor) > _RTOL * factor]
    pins = ([(max(full), 0.0)] if full else []) + ([(min(ones), 1.0)] if ones else [])
    if len(points) >= 2:
        candidates = [points]
    else:  # too few blended entries: a line through them and one edge of the band
        candidates = [points + [pin] for pin in pins] if points else [pins]
    error = "too few factors between 1 and the scaling factor to place the band"
    for anchors in candidates:
        if len(anchors) < 2:
            continue
        slope, intercept = _fit(anchors)
        if slope <= 0:
            error = "the factors do not fall from the long to the short wavelengths"
            continue
        low = -intercept / slope
        high = low + 1 / slope
        want = llama3_factors(inv_freq, factor, low, high, old)
        bad = [(i, got, expect) for i, (got, expect) in enumerate(zip(factors, want,
                                                                          strict=True))
               if abs(got - expect) > 10 * _RTOL * max(abs(expect), 1.0)]
        if not bad:
            break
        i, got, expect = bad[0]
        error = (f"factor {i} is {got:.6g} where llama3 scaling (factor {factor:g}, low "
                 f"{low:.6g}, high {high:.6g}, original {old:g}) gives {expect:.6g}")
    else:
        raise ValueError(error)
    return (("factor", float(factor)), ("high_freq_factor", high), ("low_freq_factor", low),
            ("original_max_position_embeddings", int(old)), ("rope_type", "llama3"))
