"""The Llama-family decoder with a selective-batching interface.

`Transformer.forward` takes every token scheduled in an engine step, flattened
into one (T,) batch with explicit positions, runs the dense layers on all of
them at once and delegates attention to an `AttentionContext` (which knows the
sequence boundaries and the KV cache).  Parameter names follow vLLM's fused
layout: `qkv_proj` (q rows, then k, then v) and `gate_up_proj` (gate, then up).

Each layer's mixer comes from `ModelConfig.layers()`; softmax attention is implemented
here, MLA, linear attention and the SSM in their own modules, registered in `MIXERS`
(`_MIXER_MODULES` names where each lives; it is imported on first use).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.context import AttentionContext
from infbench.model.gemma import GemmaDecoderLayer, GemmaRMSNorm
from infbench.model.layers import RMSNorm, SwiGLUMLP, apply_rope, build_rope_cache
from infbench.model.linear import make_linear, tied_logits
from infbench.model.mla import rope_attention_factor
from infbench.model.moe import MoEMLP
from infbench.model.ops import Ops
from infbench.model.softcap import softcap
from infbench.roofline.shapes import has_mlp, is_moe_layer
from kernels.cpu_decode_layer import MAX_ROWS as MAX_FUSED_DECODES


class Attention(nn.Module):
    """Softmax attention (MHA/GQA/MQA, sliding window, CLA, Llama-4's chunked and NoPE
    layers) with a fused qkv projection."""

    def __init__(
        self,
        config: ModelConfig,
        layer: LayerSpec,
        quant: QuantConfig | None,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.kv_heads
        self.head_dim = config.dim_head
        self.scale = self.head_dim**-0.5
        if config.query_pre_attn_scalar is not None:  # Gemma
            self.scale = config.query_pre_attn_scalar**-0.5
        # Partial RoPE (Phi-3's partial_rotary_factor): the kernel rotates rotary_dim dims.
        self.rotary_dim = config.rotary_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # A CLA layer that reads another layer's KV has no k/v projection at all.
        self.split_sizes = [q_size, kv_size, kv_size] if layer.owns_kv else [q_size]
        kw: dict[str, Any] = dict(quant=quant, dtype=dtype, device=device)
        self.qkv_proj = make_linear(config.hidden_size, sum(self.split_sizes),
                                    bias=config.qkv_bias or config.attention_bias, **kw)
        self.o_proj = make_linear(q_size, config.hidden_size, bias=config.attention_bias, **kw)
        # gpt-oss: one learned logit per query head in every softmax denominator.
        self.sinks: nn.Parameter | None = None
        if layer.sinks:
            self.sinks = nn.Parameter(torch.empty(self.num_heads, dtype=dtype, device=device))
        self.ops: Ops | None = None
        # Qwen3 / Gemma-3: RMSNorm over each head's q and k, before RoPE.
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if config.qk_norm:
            norm_cls = GemmaRMSNorm if config.is_gemma else RMSNorm
            self.q_norm = norm_cls(self.head_dim, config.rms_norm_eps, dtype, device)
            self.k_norm = norm_cls(self.head_dim, config.rms_norm_eps, dtype, device)
        # Llama-4: a weightless RMS ("L2") norm of q and k after RoPE on the RoPE layers, and
        # on the NoPE layers (no RoPE) the query temperature (floor, scale).
        self.l2_eps = config.rms_norm_eps if config.qk_l2_norm and layer.rope else None
        self.temperature: tuple[int, float] | None = None
        if config.attn_temperature_floor is not None and not layer.rope:
            self.temperature = (config.attn_temperature_floor, config.attn_temperature_scale)

    def set_ops(self, ops: Ops) -> None:
        self.ops = ops

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        parts = self.qkv_proj(x).split(self.split_sizes, dim=-1)  # (T, Hq*D) [, (T, Hkv*D) x2]
        q = parts[0].view(num_tokens, self.num_heads, self.head_dim)  # (T, Hq, D)
        k = v = None
        if self.layer.owns_kv:
            k = parts[1].view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
            v = parts[2].view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)  # (T, Hq, D), a new tensor
            k = self.k_norm(k) if k is not None else None
        if self.layer.rope and self.ops is not None and k is not None:
            # in place, on the qkv views (or the normed copies)
            q, k = self.ops.rope(q, k, positions, rope_cache, self.rotary_dim)
        elif self.layer.rope:  # (a NoPE layer, Llama-4's, rotates nothing)
            q, k = apply_rope(q, k, positions, rope_cache)
        if self.l2_eps is not None:
            q = l2_norm(q, self.l2_eps)
            k = l2_norm(k, self.l2_eps) if k is not None else None
        if self.temperature is not None:
            scale = query_temperature(positions, *self.temperature)[:, None, None]  # (T, 1, 1)
            q = (q * scale).to(q.dtype)  # in float32, as transformers scales
        if self.sinks is None:
            out = ctx.attention(self.layer, q, k, v, self.scale)  # (T, Hq, D)
        else:  # only the contexts that implement sinks take the argument
            out = ctx.attention(self.layer, q, k, v, self.scale, sinks=self.sinks)
        return self.o_proj(out.reshape(num_tokens, -1))  # (T, H)


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama-4's q/k norm: x / sqrt(mean(x^2) + eps) over the last dim, in float32, no
    weight (transformers' Llama4TextL2Norm)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def query_temperature(positions: torch.Tensor, floor: int, scale: float) -> torch.Tensor:
    """Llama-4's NoPE-layer query scale at each position t (T,) float32:
    1 + scale * log(1 + floor((t + 1) / floor))."""
    steps = torch.floor((positions.float() + 1.0) / floor)
    return torch.log1p(steps) * scale + 1.0


# Mixer registry: LayerSpec.mixer -> module class, every class built as
# cls(config, layer, quant, dtype, device) with forward(x, positions, ctx, rope_cache).
# The other mixers live in their own modules, imported on first use.
MIXERS: dict[str, type[nn.Module]] = {"attention": Attention}
_MIXER_MODULES = {
    "mla": ("infbench.model.mla", "MLAAttention"),
    "linear": ("infbench.model.linear_attention", "LinearAttention"),
    "ssm": ("infbench.model.mamba", "MambaMixer"),
}


def _make_mixer(
    config: ModelConfig, layer: LayerSpec, quant: QuantConfig | None, dtype: Any, device: Any
) -> nn.Module:
    if layer.mixer not in MIXERS and layer.mixer in _MIXER_MODULES:
        import importlib

        module, name = _MIXER_MODULES[layer.mixer]
        try:
            MIXERS[layer.mixer] = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    if layer.mixer not in MIXERS:
        raise ConfigError(
            f"layer {layer.index}: mixer {layer.mixer!r} is not implemented in infbench.model; "
            f"implemented: {', '.join(MIXERS)}"
        )
    return MIXERS[layer.mixer](config, layer, quant, dtype, device)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x)).

    Mamba-1 blocks (arch "mamba", see `has_mlp`) are norm + mixer only: no MLP.
    """

    def __init__(
        self,
        config: ModelConfig,
        layer: LayerSpec,
        quant: QuantConfig | None,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__()
        norm_kw: dict[str, Any] = dict(dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **norm_kw)
        self.self_attn = _make_mixer(config, layer, quant, dtype, device)
        self.post_attention_layernorm: RMSNorm | None = None
        self.mlp: nn.Module | None = None
        if has_mlp(config):
            self.post_attention_layernorm = RMSNorm(
                config.hidden_size, config.rms_norm_eps, **norm_kw
            )
            self.mlp = SwiGLUMLP(
                config.hidden_size, config.intermediate_size, quant, dtype=dtype, device=device
            )
        if self.mlp is not None and is_moe_layer(config, layer):  # router + experts
            self.mlp = MoEMLP(config, quant, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, rope_cache)  # (T, H)
        if self.mlp is None or self.post_attention_layernorm is None:
            return x
        return x + self.mlp(self.post_attention_layernorm(x))  # (T, H)

    def forward_fused(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
        ops: Ops,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same block with the kernels' fused residual-add + RMSNorm (vLLM's layout).

        Carries (x, residual) between layers: the block input is x + residual, summed
        inside the norm kernel instead of as a separate pass over the activations.
        """
        norm = self.input_layernorm
        if residual is None:
            h, residual = ops.rmsnorm(x, norm.weight, norm.eps), x
        else:
            h, residual = ops.rmsnorm(x, norm.weight, norm.eps, residual)
        x = self.self_attn(h, positions, ctx, rope_cache)  # (T, H)
        if self.mlp is None or self.post_attention_layernorm is None:
            return x, residual
        post = self.post_attention_layernorm
        h, residual = ops.rmsnorm(x, post.weight, post.eps, residual)
        return self.mlp(h), residual


def _run_chunked(plan: Any, x: torch.Tensor, residual: torch.Tensor | None,
                 positions: torch.Tensor, args: tuple[torch.Tensor, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused decode layer over more than 32 rows, 32 at a time.  Rows of one sequence
    come in position order, so a chunk only reads K/V that this or an earlier chunk of the
    layer has stored."""
    k_cache, v_cache, slots, tables, lens = args
    xs, rs = [], []
    for lo in range(0, x.shape[0], MAX_FUSED_DECODES):
        hi = lo + MAX_FUSED_DECODES
        xc, rc = plan.run(x[lo:hi], None if residual is None else residual[lo:hi],
                          positions[lo:hi], k_cache, v_cache, slots[lo:hi], tables[lo:hi],
                          lens[lo:hi])
        xs.append(xc)
        rs.append(rc)
    return torch.cat(xs), torch.cat(rs)


class Transformer(nn.Module):
    """Decoder-only LM: embed -> layers -> final norm; `compute_logits` applies the LM head.

    Built directly on `device` in `dtype`.  On the meta device nothing is allocated:
    loaders then call `to_empty(device=...)`, fill the weights and `init_rope_cache()`.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
        quant: QuantConfig | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.layer_specs = config.layers()
        # nn.Embedding, or model/quant.QuantEmbedding for a GGUF's quantized token_embd
        self.embed_tokens: nn.Module = nn.Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, spec, quant, dtype, device, _make_mixer)
            if config.is_gemma else DecoderLayer(config, spec, quant, dtype, device)
            for spec in self.layer_specs
        )
        norm_cls = GemmaRMSNorm if config.is_gemma else RMSNorm
        self.norm = norm_cls(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        # Gemma scales the embeddings by sqrt(hidden), rounded to the model dtype as HF does.
        self.embed_scale = config.hidden_size**0.5 if config.is_gemma else None
        self.lm_head: nn.Module | None = None
        if not config.tie_word_embeddings:
            self.lm_head = make_linear(
                config.hidden_size, config.vocab_size, quant=quant, dtype=dtype, device=device
            )
        # Not persistent: derived from the config, never part of a checkpoint.
        self.register_buffer("rope_cache", self._rope_cache(device), persistent=False)
        # Gemma-3: the sliding-window layers rotate with their own base (rope_local_theta).
        local = self._rope_cache(device, local=True) if config.rope_local_theta else None
        self.rope_local_cache: torch.Tensor | None
        self.register_buffer("rope_local_cache", local, persistent=False)

    @property
    def device(self) -> torch.device:
        """Where the weights live (the final norm's: the embedding may be a quantized table)."""
        return self.norm.weight.device

    def _rope_cache(self, device: Any, local: bool = False) -> torch.Tensor:
        c = self.config
        if local:  # Gemma-3's local layers: their own base, no scaling
            assert c.rope_local_theta is not None
            return build_rope_cache(c.max_seq_len, c.rot_dim, c.rope_local_theta, None,
                                    self.dtype, device)
        scaling = c.rope_scaling_dict
        # YaRN: transformers also scales cos and sin by its attention factor (the attention
        # temperature); MLA layers build their own table and apply it there.
        factor = rope_attention_factor(scaling)
        if factor == 1.0:
            return build_rope_cache(c.max_seq_len, c.rot_dim, c.rope_theta, scaling,
                                    self.dtype, device)
        table = build_rope_cache(c.max_seq_len, c.rot_dim, c.rope_theta, scaling,
                                 torch.float32, device)  # (max_pos, rot_dim)
        return (table * factor).to(self.dtype)

    def layer_rope(self, spec: LayerSpec) -> torch.Tensor:
        """The RoPE table of one layer: Gemma-3's sliding layers have their own."""
        if self.rope_local_cache is not None and spec.window is not None:
            return self.rope_local_cache
        return self.rope_cache

    def init_rope_cache(self) -> None:
        """Recompute the RoPE table and the mixers' config-derived buffers (FAVOR+ random
        features) in place, after `to_empty` left them uninitialized."""
        self.rope_cache = self._rope_cache(self.device)
        if self.rope_local_cache is not None:
            self.rope_local_cache = self._rope_cache(self.device, local=True)
        for layer in self.layers:
            init_buffers = getattr(layer.self_attn, "init_buffers", None)
            if init_buffers is not None:
                init_buffers()

    def set_ops(self, ops: Ops) -> None:
        """Bind the engine's kernel backend (`model.ops.Ops`): fused norms, RoPE and
        SiLU-and-mul in every layer, and the mixers' own kernels.  Without it (tests,
        DenseContext references) the model runs plain torch code."""
        self.ops = ops
        for layer in self.layers:
            for module in (layer.self_attn, layer.mlp):
                set_ops = getattr(module, "set_ops", None)
                if set_ops is not None:
                    set_ops(ops)
        # The cpu backend runs decode steps a whole layer per C++ call (model/fused_decode.py).
        self.decode_layers: list[Any | None] | None = None
        if ops.name == "cpu" and self.device.type == "cpu":
            from infbench.model.fused_decode import build_decode_layers

            self.decode_layers = build_decode_layers(self, Attention)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """input_ids (T,), positions (T,) -> final-normed hidden states (T, H)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"expected input_ids (T,) and positions (T,), got {tuple(input_ids.shape)} "
                f"and {tuple(positions.shape)}"
            )
        x = self.embed(input_ids)  # (T, H)
        ops = getattr(self, "ops", None)
        # Gemma blocks have no fused residual-add + norm path: they run `forward` below
        # (with the context's paged attention and the ops' RoPE).
        if ops is not None and not self.config.is_gemma:
            residual: torch.Tensor | None = None
            fused: list[Any | None] | None = getattr(self, "decode_layers", None)
            args_of: Any = getattr(ctx, "decode_layer_args", None)
            # Up to 32 decode rows per call; a speculative step's 1 + k rows per sequence
            # go in chunks of 32 when its sequences alone would fit (the rows a plain step
            # of those sequences would take this path with: the same tokens either way).
            rows = x.shape[0]
            seqs = int(getattr(ctx, "num_decode_seqs", 0) or rows)
            if fused is None or args_of is None or min(rows, seqs) > MAX_FUSED_DECODES:
                fused = [None] * len(self.layers)
            for layer, plan in zip(cast(list[DecoderLayer], self.layers), fused, strict=True):
                args = None if plan is None else args_of(layer.self_attn.layer)
                if plan is not None and args is not None and rows <= MAX_FUSED_DECODES:
                    x, residual = plan.run(x, residual, positions, *args)  # one C++ call
                elif plan is not None and args is not None:
                    x, residual = _run_chunked(plan, x, residual, positions, args)
                else:
                    x, residual = layer.forward_fused(x, residual, positions, ctx,
                                                      self.rope_cache, ops)
            return ops.rmsnorm(x, self.norm.weight, self.norm.eps, residual)[0]  # (T, H)
        for block, spec in zip(self.layers, self.layer_specs, strict=True):
            x = block(x, positions, ctx, self.layer_rope(spec))
        return self.norm(x)  # (T, H)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (T,) -> the first layer's input (T, H), Gemma's sqrt(hidden) scale applied."""
        x = self.embed_tokens(input_ids)  # (T, H)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x  # type: ignore[no-any-return]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, H) -> logits (N, V) in float32 (soft-capped when the model says so)."""
        logits = self._head_logits(hidden)
        cap = self.config.final_logit_softcap
        return logits if cap is None else softcap(logits, cap)

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head_q = getattr(self, "head_q", None)  # quant.head int8 of a tied head
        if head_q is not None:
            return head_q.logits(hidden)  # type: ignore[no-any-return]
        # A quantized head: an untied one in int8, or a GGUF file's own format (native
        # weights), tied (the embedding's table) or not.
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        head_logits = getattr(head, "logits", None)
        if head_logits is not None:
            return head_logits(hidden)  # type: ignore[no-any-return]
        if self.lm_head is None:  # tied (N, V)
            backend = self.ops.name if getattr(self, "ops", None) is not None else "torch"
            weight = self.embed_tokens.weight  # (V, H)
            assert isinstance(weight, torch.Tensor)
            return tied_logits(hidden, weight, backend)
        return self.lm_head(hidden).float()  # (N, V)
