"""Building blocks of a Llama decoder layer: RMSNorm, rotary embeddings, SwiGLU MLP.

Token-major shapes throughout: the engine flattens every scheduled token of a
step into one (T, ...) batch, so nothing here knows about sequences.  The RoPE
cache uses vLLM's layout, (max_pos, rot_dim) with cos in the first half and sin
in the second, so a Triton kernel can later read one row per token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.linear import make_linear
from infbench.model.ops import Ops

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, as in HF Llama."""

    def __init__(
        self, dim: int, eps: float, dtype: torch.dtype | None = None, device: Any = None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(rot_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies (rot_dim // 2,) in float32, after the configured scaling."""
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim
    inv_freq = 1.0 / (theta**exponents)  # (rot_dim // 2,)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if scaling is None or kind == "default":
        return inv_freq
    if kind == "linear":
        # Position interpolation: position p behaves like p / factor.
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, rot_dim, theta, scaling)
    raise ConfigError(
        f"rope_scaling type {kind!r} is not supported; allowed: {', '.join(ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short kept, the band between blended."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn_inv_freq(
    inv_freq: torch.Tensor, rot_dim: int, theta: float, scaling: dict[str, Any]
) -> torch.Tensor:
    """YaRN (DeepSeek-V2, as transformers computes it): interpolate the low frequencies.

    Frequencies doing fewer than beta_slow turns over the original context are divided
    by `factor`, those doing more than beta_fast are kept, with a linear ramp between.
    The attention temperature (mscale) is the caller's business: it scales cos/sin and
    the softmax, not the frequencies.
    """
    factor = float(scaling["factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:  # the dim doing `rotations` turns
        return rot_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (original frequency), 0: interpolate (divided by factor)
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def build_rope_cache(
    max_pos: int,
    rot_dim: int,
    theta: float,
    scaling: dict[str, Any] | None,
    dtype: torch.dtype,
    device: Any,
) -> torch.Tensor:
    """cos/sin table (max_pos, rot_dim): cos in [:, :rot_dim//2], sin in [:, rot_dim//2:]."""
    if rot_dim % 2:
        raise ConfigError(f"RoPE dimension must be even, got {rot_dim}")
    inv_freq = rope_inv_freq(rot_dim, theta, scaling).to(device)
    positions = torch.arange(max_pos, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, inv_freq)  # (max_pos, rot_dim // 2)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)  # (max_pos, rot_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (GPT-NeoX / HF Llama layout) on the first rot_dim dims of x (T, H, D)."""
    rot_dim = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    x1, x2 = x_rot.chunk(2, dim=-1)  # (T, H, rot_dim // 2) each
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, rot_dim // 2)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([out, x_pass], dim=-1) if x_pass.numel() else out


def apply_rope(
    q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q (T, Hq, D) and k (T, Hkv, D) (None for a layer without own KV) by positions (T,)."""
    cos, sin = cache[positions].chunk(2, dim=-1)  # (T, rot_dim // 2) each
    return _rotate(q, cos, sin), (_rotate(k, cos, sin) if k is not None else None)


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        quant: QuantConfig | None = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        kw: dict[str, Any] = dict(quant=quant, dtype=dtype, device=device)
        self.gate_up_proj = make_linear(hidden_size, 2 * intermediate_size, **kw)
        self.down_proj = make_linear(intermediate_size, hidden_size, **kw)

    def set_ops(self, ops: Ops) -> None:
        """Use the backend's fused silu_and_mul (engine); plain torch without it."""
        self.ops: Ops | None = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (T, 2I): gate rows first, then up
        ops = getattr(self, "ops", None)
        if ops is not None:
            return self.down_proj(ops.silu_and_mul(gate_up))  # (T, H)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up)  # (T, H)
