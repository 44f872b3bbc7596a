"""Draft heads on the target's hidden states for speculative decoding: Medusa and EAGLE.

Both read the target's *features*: f_t, the final-normed hidden state of position t (the
LM head's input, which predicts token x_{t+1}), and both decode through the target's own
LM head (`target.compute_logits`), so a head adds a few million parameters, not a model.

- `MedusaHeads` (Cai et al. 2024): K residual blocks h + SiLU(W_i h + b_i), W_i and b_i
  zero at initialisation (each head starts as the identity, i.e. as the target's own
  next-token prediction).  Head i applied to f_t predicts x_{t+1+i}: from f_{L-2} head j
  drafts position L-1+j.  All heads read the same feature, so drafts cost one batched
  LM-head product, whatever k.
- `EagleHead` (Li et al. 2024, EAGLE-1): row j is concat(f_j, embed(x_{j+1})) -> Linear
  (2H -> H) -> one Llama decoder layer (the target's `DecoderLayer`: RMSNorm, causal
  self-attention with RoPE, SwiGLU MLP) -> g_j, trained to approximate f_{j+1};
  argmax compute_logits(g_j) drafts x_{j+2}.  Drafting continues autoregressively on its
  own outputs: row j+1 is (g_j, embed(draft)).  The head keeps a small K/V cache per
  sequence (`EagleKV`, immutable: extending returns a new one), so a proposer keeps the
  entries built from real target features and drops the speculative ones by not
  storing them.

`EagleHead.forward` runs whole sequences packed back to back (training, and the reference
the incremental `extend` is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig
from infbench.model.context import DenseContext, LayerState
from infbench.model.layers import build_rope_cache
from infbench.model.transformer import DecoderLayer, Transformer

INIT_STD = 0.02  # EAGLE layer weights ~ N(0, 0.02), as HF Llama initialises


def _target_dtype(target: Transformer) -> torch.dtype:
    return target.dtype


class MedusaHeads(nn.Module):
    """K Medusa heads: head i (1-based) maps f_t to a hidden state whose logits predict
    x_{t+1+i}."""

    def __init__(self, hidden_size: int, num_heads: int, dtype: torch.dtype = torch.float32,
                 device: Any = None) -> None:
        super().__init__()
        if num_heads < 1 or hidden_size < 1:
            raise ValueError(f"Medusa needs num_heads >= 1 and hidden_size >= 1, got "
                             f"{num_heads} and {hidden_size}")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.blocks = nn.ModuleList(
            nn.Linear(hidden_size, hidden_size, dtype=dtype, device=device)
            for _ in range(num_heads))
        for block in self.blocks:
            nn.init.zeros_(cast(nn.Linear, block).weight)
            nn.init.zeros_(cast(nn.Linear, block).bias)

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """hidden (N, H) -> the first `num_heads` heads' outputs (K', N, H)."""
        blocks = list(self.blocks)[: self.num_heads if num_heads is None else num_heads]
        h = hidden.to(cast(nn.Linear, self.blocks[0]).weight.dtype)
        return torch.stack([h + F.silu(block(h)) for block in blocks])  # (K', N, H)

    def draft(self, target: Transformer, features: torch.Tensor, num_drafts: int) -> torch.Tensor:
        """Greedy drafts (B, n) of B sequences from their last features (B, H), f_{L-2}:
        column j-1 is head j's argmax, the token at position L-1+j; n = min(num_drafts, K)."""
        n = min(num_drafts, self.num_heads)
        if n <= 0 or features.shape[0] == 0:
            return torch.empty(features.shape[0], 0, dtype=torch.long, device=features.device)
        out = self(features, n).to(_target_dtype(target))  # (n, B, H)
        logits = target.compute_logits(out.reshape(-1, out.shape[-1]))  # (n*B, V)
        return logits.argmax(-1).view(n, -1).t()  # (B, n)


@dataclass(frozen=True)
class EagleKV:
    """One sequence's EAGLE cache: keys and values (L, Hkv, D) of rows 0..L-1."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.k.shape[0])

    def truncate(self, length: int) -> EagleKV:
        return self if length >= self.length else EagleKV(self.k[:length], self.v[:length])


class _CachedContext:
    """AttentionContext of `EagleHead.extend`: each sequence's new rows attend to its cache
    and causally to each other; the extended caches are left in `out`."""

    def __init__(self, caches: list[EagleKV], counts: list[int]) -> None:
        self.caches, self.counts = caches, counts
        self.out: list[EagleKV] = []

    @property
    def num_decode(self) -> int:
        return 0

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float) -> torch.Tensor:
        assert k is not None and v is not None  # the EAGLE layer owns its K/V
        out = torch.empty_like(q)  # (T, Hq, D)
        start = 0
        for cache, n in zip(self.caches, self.counts, strict=True):
            end = start + n
            keys = torch.cat([cache.k, k[start:end]])  # (L + n, Hkv, D)
            values = torch.cat([cache.v, v[start:end]])
            self.out.append(EagleKV(keys, values))
            t = torch.arange(cache.length, cache.length + n, device=q.device)[:, None]  # (n, 1)
            visible = torch.arange(keys.shape[0], device=q.device)[None, :] <= t  # (n, L + n)
            o = F.scaled_dot_product_attention(  # (1, Hq, n, D)
                q[start:end].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None], attn_mask=visible, scale=scale,
                enable_gqa=keys.shape[1] != q.shape[1])
            out[start:end] = o[0].transpose(0, 1)  # (n, Hq, D)
            start = end
        return out

    def state(self, layer: LayerSpec) -> LayerState:
        raise NotImplementedError("the EAGLE layer is softmax attention only")

    def mla_attention(self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor,
                      scale: float) -> torch.Tensor:
        raise NotImplementedError("the EAGLE layer is softmax attention only")

    def mla_prefill_latents(self, layer: LayerSpec,
                            latent: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        raise NotImplementedError("the EAGLE layer is softmax attention only")


class EagleHead(nn.Module):
    """EAGLE-1 draft head: fc(concat(f_j, embed(x_{j+1}))) -> one decoder layer -> g_j ~ f_{j+1}.

    Row j sits at RoPE position j.  The embedding and the LM head are the target's (the
    caller embeds tokens with `target.embed_tokens`; drafts go through
    `target.compute_logits`).
    """

    def __init__(self, hidden_size: int, num_attention_heads: int, num_kv_heads: int,
                 intermediate_size: int, rope_theta: float, dtype: torch.dtype = torch.float32,
                 *, rms_norm_eps: float = 1e-5, device: Any = None) -> None:
        super().__init__()
        self.config = ModelConfig(
            name="eagle-head", vocab_size=1, hidden_size=hidden_size, num_layers=1,
            num_heads=num_attention_heads, num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size, rope_theta=rope_theta,
            rms_norm_eps=rms_norm_eps)
        self.hidden_size = hidden_size
        self.fc = nn.Linear(2 * hidden_size, hidden_size, dtype=dtype, device=device)
        self.layer = DecoderLayer(self.config, self.config.layers()[0], None, dtype, device)
        self._rope: torch.Tensor | None = None  # grown on demand: (max_pos, head_dim)

    def init_weights(self, generator: torch.Generator) -> None:
        """Seeded initialisation: linear weights ~ N(0, INIT_STD), biases 0, norms 1."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, INIT_STD, generator=generator)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight"):
                    p.fill_(1.0)

    def empty_cache(self) -> EagleKV:
        w = self.fc.weight
        shape = (0, self.config.kv_heads, self.config.dim_head)
        return EagleKV(w.new_empty(shape), w.new_empty(shape))

    def _rope_cache(self, max_position: int) -> torch.Tensor:
        w = self.fc.weight
        if (self._rope is None or self._rope.shape[0] <= max_position
                or self._rope.dtype != w.dtype or self._rope.device != w.device):
            size = max(1024, 1 << max_position.bit_length())
            self._rope = build_rope_cache(size, self.config.dim_head, self.config.rope_theta,
                                          None, w.dtype, w.device)
        return self._rope

    def _rows(self, features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([features.to(dtype), embeds.to(dtype)], dim=-1))  # (T, H)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor,
                cu_seqlens: list[int]) -> torch.Tensor:
        """Whole sequences packed back to back: features (T, H) f_j, embeds (T, H) of
        x_{j+1}, sequence b owning rows cu_seqlens[b]:cu_seqlens[b+1] at positions 0.. ->
        g (T, H)."""
        positions = torch.cat([torch.arange(b - a, device=features.device)
                               for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)])
        rope = self._rope_cache(max(b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:],
                                                          strict=True)))
        ctx = DenseContext(cu_seqlens)
        return cast(torch.Tensor, self.layer(self._rows(features, embeds), positions, ctx, rope))

    def extend(self, features: torch.Tensor, embeds: torch.Tensor, counts: list[int],
               caches: list[EagleKV]) -> tuple[torch.Tensor, list[EagleKV]]:
        """Incremental rows: sequence b appends counts[b] rows (packed in order in features
        and embeds (T, H)) after its cache, at positions cache.length.. -> (g (T, H), the
        extended caches).  The given caches are not modified."""
        device = features.device
        positions = torch.cat([torch.arange(c.length, c.length + n, device=device)
                               for c, n in zip(caches, counts, strict=True)])
        rope = self._rope_cache(int(positions.max()) if positions.numel() else 0)
        ctx = _CachedContext(caches, counts)
        g = self.layer(self._rows(features, embeds), positions, ctx, rope)  # (T, H)
        return g, ctx.out

    def logits(self, target: Transformer, g: torch.Tensor) -> torch.Tensor:
        """Draft logits of the head's outputs g (N, H): the target's own LM head."""
        return target.compute_logits(g.to(_target_dtype(target)))

    def draft(self, target: Transformer, last_g: torch.Tensor, caches: list[EagleKV],
              num_drafts: list[int]) -> list[list[int]]:
        """Greedy drafts of B sequences whose caches hold every real row (through j = L-2)
        and whose last row gave last_g (B, H), g_{L-2}: draft 1 is argmax logits(g_{L-2}),
        then row (g, embed(draft)) feeds the next; these speculative rows extend copies of
        the caches only.  Sequence b gets num_drafts[b] tokens."""
        return greedy_drafts(self, target, last_g, caches, num_drafts)


def greedy_drafts(head: Any, target: Transformer, last_g: torch.Tensor, caches: list[Any],
                  num_drafts: list[int]) -> list[list[int]]:
    """The autoregressive greedy loop of a draft layer with per-sequence caches (EAGLE, and
    DeepSeek's MTP module in `model/mtp.py`): `head.logits(target, g)` drafts a token from
    each row's output, `head.extend` builds the next row (g, embed(draft)) on copies of the
    caches.  Sequence b gets num_drafts[b] tokens."""
    drafts: list[list[int]] = [[] for _ in caches]
    live = [b for b, k in enumerate(num_drafts) if k > 0]
    g = last_g[torch.tensor(live, dtype=torch.long, device=last_g.device)]  # (B', H)
    step = 0
    while live:
        tokens = head.logits(target, g).argmax(-1).tolist()  # (len(live),)
        for b, token in zip(live, tokens, strict=True):
            drafts[b].append(int(token))
        step += 1
        keep = [i for i, b in enumerate(live) if num_drafts[b] > step]
        if not keep:
            break
        live = [live[i] for i in keep]
        index = torch.tensor(keep, device=g.device)
        ids = torch.tensor([drafts[b][-1] for b in live], device=g.device)  # (B',)
        g, new = head.extend(g[index], target.embed_tokens(ids), [1] * len(live),
                             [caches[b] for b in live])
        caches = list(caches)
        for b, cache in zip(live, new, strict=True):
            caches[b] = cache
    return drafts
