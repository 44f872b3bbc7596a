"""Gemma-2 / Gemma-3 decoder blocks: (1 + w) RMSNorms around both sublayers and GeGLU.

A Gemma block normalizes each sublayer's input and its output before the residual add
(`input_layernorm` -> attention -> `post_attention_layernorm`, then
`pre_feedforward_layernorm` -> MLP -> `post_feedforward_layernorm`), its RMSNorms scale by
(1 + weight) in float32, and its MLP is down(gelu_tanh(gate) * up).  The mixer (softmax
attention, with soft-capping, q/k norms and the query_pre_attn_scalar scale) is the shared
`transformer.Attention`, handed in by the model so this module does not import it.

These blocks have no fused residual-add kernel path and no fused CPU decode layer
(`model/fused_decode.py` builds none for them): the model runs them through `forward`,
with the engine's paged attention context and RoPE kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.model.context import AttentionContext
from infbench.model.linear import make_linear


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), computed in float32 and cast back (HF Gemma's order)."""

    def __init__(
        self, dim: int, eps: float, dtype: torch.dtype | None = None, device: Any = None
    ) -> None:
        super().__init__()
        self.eps = eps
        # Zeros: a freshly built Gemma norm is the identity scale, as in transformers.
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GeGLUMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up fused into one matmul (gate rows first)."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # (T, I) each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)  # (T, H)


MixerFactory = Callable[[ModelConfig, LayerSpec, QuantConfig | None, Any, Any], nn.Module]


class GemmaDecoderLayer(nn.Module):
    """x + post_norm(attn(norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x)))."""

    def __init__(
        self,
        config: ModelConfig,
        layer: LayerSpec,
        quant: QuantConfig | None,
        dtype: torch.dtype | None,
        device: Any,
        make_mixer: MixerFactory,
    ) -> None:
        super().__init__()

        def norm() -> GemmaRMSNorm:
            return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)

        self.input_layernorm = norm()
        self.self_attn = make_mixer(config, layer, quant, dtype, device)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()
        self.mlp = GeGLUMLP(config.hidden_size, config.intermediate_size, quant, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), positions, ctx, rope_cache)  # (T, H)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))  # (T, H)
        return x + self.post_feedforward_layernorm(h)  # (T, H)
