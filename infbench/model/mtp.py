"""DeepSeek-V3's multi-token-prediction (MTP) module as a draft head for speculative decoding.

The checkpoint stores the module after the main layers, as `model.layers.{N}.*` with N the
main model's `num_hidden_layers` (61 for DeepSeek-V3): `enorm`, `hnorm`, `eh_proj`
(2H -> H), a whole decoder layer (MLA and, in V3, MoE: `self_attn.*`, `mlp.*`,
`input_layernorm`, `post_attention_layernorm`) and `shared_head.norm`; its `embed_tokens`
and `shared_head.head` are copies of the main model's, which the head uses instead.

Row j of a sequence combines the target's feature f_j (the final-normed hidden state of
position j, the LM head's input) with the next token x_{j+1}:

    g_j = Layer(eh_proj([enorm(embed(x_{j+1})); hnorm(f_j)]))   at RoPE position j
    logits_j = head(shared_head.norm(g_j))                        drafts x_{j+2}

and drafting continues on its own outputs, row j+1 = (g_j, the draft), as vLLM applies one
module recursively for more than one draft token.  The layer attends causally over the
module's own cache of latent rows (`MTPCache`, one per sequence, immutable like EAGLE's),
so the proposer is `engine/spec/heads.EagleProposer`'s bookkeeping over this head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig
from infbench.model.context import LayerState
from infbench.model.draft_heads import greedy_drafts
from infbench.model.layers import RMSNorm
from infbench.model.linear import make_linear
from infbench.model.transformer import DecoderLayer, Transformer
from infbench.roofline.shapes import mtp_layer


@dataclass(frozen=True)
class MTPCache:
    """One sequence's MTP cache: the layer's latent rows (L, kv_lora_rank + rope_dim)."""

    latent: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.latent.shape[0])

    def truncate(self, length: int) -> MTPCache:
        return self if length >= self.length else MTPCache(self.latent[:length])


class _LatentContext:
    """AttentionContext of `MTPHead.extend`: no decode rows, so the MLA layer runs its
    decompressed form over each sequence's cached latents followed by its new rows; the
    extended caches are left in `out`."""

    def __init__(self, caches: list[MTPCache], counts: list[int]) -> None:
        self.caches, self.counts = caches, counts
        self.out: list[MTPCache] = []

    @property
    def num_decode(self) -> int:
        return 0

    def mla_prefill_latents(self, layer: LayerSpec,
                            latent: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        contexts, start = [], 0
        for cache, n in zip(self.caches, self.counts, strict=True):
            rows = torch.cat([cache.latent, latent[start:start + n]])  # (L + n, Dl + Dr)
            self.out.append(MTPCache(rows))
            contexts.append((rows, n))
            start += n
        return contexts

    def attention(self, layer: LayerSpec, q: torch.Tensor, k: torch.Tensor | None,
                  v: torch.Tensor | None, scale: float) -> torch.Tensor:
        raise NotImplementedError("the MTP layer is MLA (DeepSeek-V3)")

    def mla_attention(self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor,
                      scale: float) -> torch.Tensor:
        raise NotImplementedError("the MTP context has no decode rows")

    def state(self, layer: LayerSpec) -> LayerState:
        raise NotImplementedError("the MTP layer has no recurrent state")


class _SharedHead(nn.Module):
    """`shared_head`: the norm before the (shared) LM head; the head is the target's."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps, dtype, device)


class MTPLayer(DecoderLayer):
    """The module's decoder layer plus its merge (enorm, hnorm, eh_proj) and shared_head.norm,
    under the checkpoint's leaf names."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: Any) -> None:
        super().__init__(config, mtp_layer(config), None, dtype, device)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps, dtype, device)
        self.hnorm = RMSNorm(h, eps, dtype, device)
        self.eh_proj = make_linear(2 * h, h, quant=None, dtype=dtype, device=device)
        self.shared_head = _SharedHead(h, eps, dtype, device)


class MTPHead(nn.Module):
    """One MTP module over a target: `extend` builds rows into per-sequence caches, `draft`
    proposes greedy tokens (the interface of `draft_heads.EagleHead`)."""

    def __init__(self, target: Transformer) -> None:
        super().__init__()
        config = target.config
        if config.num_mtp_layers < 1:
            raise ValueError(f"model {config.name!r} has no MTP module")
        self.config = config
        self.index = config.num_layers  # the checkpoint's model.layers.{index}
        # layers[0]: named like a Transformer's layers, so the checkpoint loader fills it
        self.layers = nn.ModuleList([MTPLayer(config, target.dtype, target.device)])
        self.lm_head = None  # the loader skips lm_head.weight: the target's is used
        self.rope_cache = target.rope_cache  # unused by MLA layers, passed for the signature

    @property
    def layer(self) -> MTPLayer:
        return cast(MTPLayer, self.layers[0])

    def empty_cache(self) -> MTPCache:
        a = self.config.attention
        w = cast(torch.Tensor, self.layer.eh_proj.weight)
        return MTPCache(w.new_empty(0, a.kv_lora_rank + a.qk_rope_head_dim))

    def extend(self, features: torch.Tensor, embeds: torch.Tensor, counts: list[int],
               caches: list[MTPCache]) -> tuple[torch.Tensor, list[MTPCache]]:
        """Sequence b appends counts[b] rows (features f_j and embeddings of x_{j+1}, (T, H)
        each, packed in order) after its cache, at positions cache.length.. -> (g (T, H),
        the extended caches); the given caches are not modified."""
        layer, device = self.layer, features.device
        dtype = cast(torch.Tensor, layer.eh_proj.weight).dtype
        positions = torch.cat([torch.arange(c.length, c.length + n, device=device)
                               for c, n in zip(caches, counts, strict=True)])
        merged = torch.cat([layer.enorm(embeds.to(dtype)), layer.hnorm(features.to(dtype))],
                           dim=-1)  # (T, 2H): the embedding first, as DeepSeek concatenates
        ctx = _LatentContext(caches, counts)
        g = layer(layer.eh_proj(merged), positions, ctx, self.rope_cache)  # (T, H)
        return g, ctx.out

    def logits(self, target: Transformer, g: torch.Tensor) -> torch.Tensor:
        """The shared head on g (N, H): shared_head.norm, then the target's LM head."""
        return target.compute_logits(self.layer.shared_head.norm(g).to(target.norm.weight.dtype))

    def draft(self, target: Transformer, last_g: torch.Tensor, caches: list[MTPCache],
              num_drafts: list[int]) -> list[list[int]]:
        """Greedy drafts of B sequences whose caches hold every real row and whose last row
        gave last_g (B, H): the module applied recursively on its own outputs (rows built
        from drafts extend copies of the caches only)."""
        return greedy_drafts(self, target, last_g, caches, num_drafts)
