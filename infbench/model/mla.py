"""Multi-head latent attention (DeepSeek-V2) with the absorbed-weight cached path.

Per token MLA compresses K and V into one latent row: c_kv (kv_lora_rank values,
RMS-normed) plus a decoupled RoPE key k_pe (qk_rope_head_dim values) shared by all
heads.  The cache keeps only that row (512 + 64 values per token and layer for
DeepSeek-V2).  Instead of expanding the latent into per-head keys and values for
every cached token, the cached path folds kv_b_proj into the query and the output
(the "weight absorption" of the DeepSeek-V2 paper, as vLLM and FlashMLA run it):

    score_h(t, p) = q_nope_h . (W_UK_h c_p) + q_pe_h . k_pe_p
                  = (W_UK_h^T q_nope_h) . c_p + q_pe_h . k_pe_p
    out_h(t)      = W_UV_h  sum_p softmax(score_h)(p) c_p

so attention is multi-query attention over [c, k_pe] with values c, and W_UK / W_UV
are views of kv_b_proj's weight.  Parameter names follow transformers'
`DeepseekV2Attention`, so a checkpoint maps one to one.  RoPE is the interleaved
(GPT-J) layout transformers applies to DeepSeek-V2 (pairs 2i, 2i+1 rotate together),
with YaRN's attention factor on cos/sin and its mscale on the softmax scale.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.model.context import AttentionContext
from infbench.model.layers import RMSNorm, rope_inv_freq
from infbench.model.linear import make_linear

# transformers builds q_a_layernorm / kv_a_layernorm with DeepseekV2RMSNorm's default eps,
# not config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched `scale` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(scaling: dict[str, Any] | None) -> float:
    """The factor transformers multiplies cos and sin by (1 except for YaRN)."""
    if not scaling or scaling.get("rope_type", "default") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
    return yarn_mscale(factor)


def mla_softmax_scale(config: ModelConfig) -> float:
    """1/sqrt(nope + rope), times mscale(factor, mscale_all_dim)^2 under rope scaling."""
    a = config.attention
    scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5
    scaling = config.rope_scaling_dict or {}
    if scaling.get("rope_type", "default") != "default" and scaling.get("mscale_all_dim"):
        m = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= m * m
    return scale


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on pairs (x[2i], x[2i+1]) in float32, cast back; cos/sin broadcast to (..., D/2)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (..., D/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


class MLAAttention(nn.Module):
    """DeepSeek-V2 attention: low-rank q (optional), latent KV, absorbed cached attention."""

    # Projections the weight quantizers leave in the model dtype (`quant.quantizable_linears`)
    float_children = ("kv_b_proj",)

    def __init__(
        self,
        config: ModelConfig,
        layer: LayerSpec,
        quant: QuantConfig | None,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__()
        a = config.attention
        self.layer = layer
        self.num_heads = config.num_heads
        self.kv_lora_rank, self.rope_dim = a.kv_lora_rank, a.qk_rope_head_dim
        self.nope_dim, self.v_head_dim = a.qk_nope_head_dim, a.v_head_dim
        self.q_lora_rank = a.q_lora_rank
        self.scale = mla_softmax_scale(config)
        h, hidden, q_head = config.num_heads, config.hidden_size, self.nope_dim + self.rope_dim
        kw: dict[str, Any] = dict(quant=quant, dtype=dtype, device=device)
        if self.q_lora_rank is None:
            self.q_proj = make_linear(hidden, h * q_head, **kw)
        else:
            self.q_a_proj = make_linear(hidden, self.q_lora_rank, **kw)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS, dtype, device)
            self.q_b_proj = make_linear(self.q_lora_rank, h * q_head, **kw)
        self.kv_a_proj_with_mqa = make_linear(hidden, self.kv_lora_rank + self.rope_dim, **kw)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS, dtype, device)
        # Never quantized: absorption multiplies by per-head slices of this weight.
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, h * (self.nope_dim + self.v_head_dim),
                                   bias=False, dtype=dtype, device=device)
        self.o_proj = make_linear(h * self.v_head_dim, hidden, **kw)
        # Frequencies only (rope_dim / 2 floats): cos/sin are computed for each step's
        # positions, in float32 as transformers does, so no max_seq_len table per layer.
        self._inv_freq = rope_inv_freq(self.rope_dim, config.rope_theta, config.rope_scaling_dict)
        self._attention_factor = rope_attention_factor(config.rope_scaling_dict)
        # Prefill rows expand the latent into per-head K/V (cheaper than MQA at Dl + Dr
        # with every head); decode rows always take the absorbed path.  False: all rows
        # absorbed (the reference form the tests compare against).
        self.decompressed_prefill = True

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of kv_b_proj's weight: W_UK (H, nope, Dl) and W_UV (H, v_head_dim, Dl).

        Taken on every call, never stored: loaders and the CPU GEMV layout swap the
        weight's storage after construction.
        """
        w = self.kv_b_proj.weight.unflatten(0, (self.num_heads, -1))  # (H, nope + v, Dl)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self._inv_freq[None, :]  # (T, rope_dim / 2)
        return freqs.cos() * self._attention_factor, freqs.sin() * self._attention_factor

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        del rope_cache  # the model-wide table is rotate-half over dim_head; MLA has its own
        num_tokens = x.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(num_tokens, self.num_heads, self.nope_dim + self.rope_dim)  # (T, H, nope+rope)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)  # (T, Dl)
        cos, sin = self._cos_sin(positions)  # (T, rope_dim / 2) each
        q_pe = rotate_interleaved(q_pe, cos[:, None], sin[:, None])  # (T, H, Dr)
        k_pe = rotate_interleaved(k_pe, cos, sin)  # (T, Dr): one key for all heads

        latent = torch.cat([c_kv, k_pe], dim=-1)  # (T, Dl + Dr): what the cache stores
        nd = ctx.num_decode if self.decompressed_prefill else num_tokens
        parts = []
        if nd > 0:  # stores the decode rows' latents, then attends over the cache
            parts.append(self._absorbed(q_nope[:nd], q_pe[:nd], latent[:nd], ctx))
        if nd < num_tokens:  # stores every row of the step, then gathers the contexts
            contexts = ctx.mla_prefill_latents(self.layer, latent)
            parts.append(self._decompressed(q_nope[nd:], q_pe[nd:], contexts))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)  # (T, H, v_head_dim)
        return self.o_proj(out.reshape(num_tokens, -1))  # (T, hidden)

    def _absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor,
                  ctx: AttentionContext) -> torch.Tensor:
        """Weight-absorbed MQA over the latent cache: (N, H, nope), (N, H, Dr) -> (N, H, v)."""
        w_uk, w_uv = self.absorbed_weights()
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # (N, H, Dl)
        q_cat = torch.cat([q_latent, q_pe], dim=-1)  # (N, H, Dl + Dr)
        # A context that cannot split the latent (DenseContext without a config) returns
        # all Dl + Dr dims; the first Dl are the attention output.
        out = ctx.mla_attention(self.layer, q_cat, latent, self.scale)[..., : self.kv_lora_rank]
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2))  # (H, N, v_head_dim)
        return out.transpose(0, 1)  # (N, H, v_head_dim)

    def _decompressed(self, q_nope: torch.Tensor, q_pe: torch.Tensor,
                      contexts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        """Prefill rows in the un-absorbed form: per-head K and V expanded from the latent.

        q_nope (N, H, nope), q_pe (N, H, Dr): the prefill rows, sequence after sequence;
        contexts[b] = (latent (L_b, Dl + Dr), q_len_b): sequence b's latent rows, of which
        the last q_len_b are its queries'.  Attention per head runs at nope + rope (192
        for DeepSeek-V2) instead of Dl + Dr (576); the expansion is one kv_b_proj GEMM
        over the context rows.
        Returns (N, H, v_head_dim).
        """
        q = torch.cat([q_nope, q_pe], dim=-1)  # (N, H, nope + Dr)
        out = q.new_empty(q.shape[0], self.num_heads, self.v_head_dim)  # (N, H, v)
        start = 0
        for lat, q_len in contexts:
            lat = lat.to(q.dtype)
            length = lat.shape[0]
            c_kv, k_pe = lat.split([self.kv_lora_rank, self.rope_dim], dim=-1)
            kv = self.kv_b_proj(c_kv).view(length, self.num_heads, -1)  # (L, H, nope + v)
            k_nope, v = kv.split([self.nope_dim, self.v_head_dim], dim=-1)
            k_pe = k_pe[:, None].expand(length, self.num_heads, self.rope_dim)  # (L, H, Dr)
            k = torch.cat([k_nope, k_pe], dim=-1)  # (L, H, nope + Dr)
            # SDPA's (1, H, len, D) layout for one sequence
            qs = q[start : start + q_len].transpose(0, 1).unsqueeze(0)  # (1, H, q_len, D)
            ks = k.transpose(0, 1).unsqueeze(0)  # (1, H, L, nope + Dr)
            vs = v.transpose(0, 1).unsqueeze(0)  # (1, H, L, v)
            o = _tail_causal_sdpa(qs, ks, vs, self.layer.window, self.scale)
            out[start : start + q_len] = o.squeeze(0).transpose(0, 1)  # (q_len, H, v)
            start += q_len
        return out


def _tail_causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                      scale: float) -> torch.Tensor:
    """Causal SDPA of the last q_len positions of a sequence over all its L keys.

    q (1, H, q_len, D), k (1, H, L, D), v (1, H, L, Dv) -> (1, H, q_len, Dv); query j sits
    at position L - q_len + j and sees key p iff p <= its position and, with a window,
    position - p < window.
    """
    q_len, length = q.shape[2], k.shape[2]
    qk_dim, v_dim = q.shape[-1], v.shape[-1]
    # Fused (flash) SDPA wants one head size for q, k and v; otherwise torch falls back to
    # the math path, which materializes the scores (4x slower on CPU at 16k).  Zero
    # padding changes neither the scores (the scale is explicit) nor the kept outputs.
    if v_dim < qk_dim:
        v = F.pad(v, (0, qk_dim - v_dim))  # (1, H, L, qk_dim)
    elif qk_dim < v_dim:
        q, k = F.pad(q, (0, v_dim - qk_dim)), F.pad(k, (0, v_dim - qk_dim))  # (.., v_dim)
    if q_len == length and window is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        t = torch.arange(length - q_len, length, device=q.device)[:, None]  # (q_len, 1) query
        p = torch.arange(length, device=q.device)[None, :]  # (1, L) key position
        visible = p <= t
        if window is not None:
            visible = visible & (t - p < window)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    return out[..., :v_dim]  # (1, H, q_len, Dv)
