"""How the model asks for attention: the `AttentionContext` protocol and a dense reference.

The model computes q, k, v for all T tokens of a step and hands them to the
context; the context knows which tokens belong to which sequence, where their
KV cache lives and what the layer's window is.  The engine's paged context
implements the same method.  `DenseContext` keeps no cache: it attends over the
tokens of this call only, which is the "full recompute" reference for tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

import torch
import torch.nn.functional as F

from infbench.core.config import LayerSpec, ModelConfig
from infbench.model.softcap import softcapped_attention
from kernels._paged_attention import attention_ref


@dataclass
class LayerState:
    """What a linear-attention or SSM layer needs: its state slots and the step layout.

    `tensors[name]` is (num_slots, ...); sequence b owns tokens
    cu_seqlens[b]:cu_seqlens[b+1] and state slot `slots[b]`; a sequence whose
    start_pos is 0 begins from a zero state (new, or recomputed after preemption).
    The first `num_decode` sequences have exactly one token each.
    """

    tensors: dict[str, torch.Tensor]
    slots: torch.Tensor
    cu_seqlens: torch.Tensor
    start_pos: torch.Tensor
    num_decode: int


class LanguageModel(Protocol):
    """What the engine needs of a model (infbench.model.transformer.Transformer has it)."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 ctx: AttentionContext) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class AttentionContext(Protocol):
    """Per-step attention over the flattened batch."""

    def attention(
        self,
        layer: LayerSpec,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) or None when `layer` reads `layer.kv_source`'s KV;
        sinks (Hq,): the attention-sink logits of a layer with `layer.sinks` (gpt-oss).

        Returns (T, Hq, D).
        """
        ...

    def state(self, layer: LayerSpec) -> LayerState:
        """The recurrent state slots of a linear-attention or SSM layer for this call."""
        ...

    def mla_attention(
        self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """MLA, absorbed form: q (T, H, Dl + Dr), latent (T, Dl + Dr) -> (T, H, Dl).

        Keys are whole latent rows (shared by all heads), values their first Dl dims.
        A context that does not know Dl (DenseContext built without a config) may return
        the attention over the whole rows, (T, H, Dl + Dr); the caller keeps the first Dl.
        """
        ...

    @property
    def num_decode(self) -> int:
        """The first num_decode rows of the step are single-token decodes (0: none)."""
        ...

    def mla_prefill_latents(
        self, layer: LayerSpec, latent: torch.Tensor
    ) -> list[tuple[torch.Tensor, int]]:
        """Store this step's latent rows (T, Dl + Dr); return each prefill sequence's context.

        One (latent (L_b, Dl + Dr), q_len_b) per prefill sequence, in batch order: every
        latent row the sequence has so far (earlier cached tokens, then this chunk), and
        how many of them (the last q_len_b) are this step's, for the decompressed form.
        """
        ...


def causal_window_mask(length: int, window: int | None, device: torch.device,
                       chunk: int | None = None) -> torch.Tensor:
    """Boolean (L, L) mask, True where key p is visible to query t: p <= t and t - p < window
    (and p // chunk == t // chunk, Llama-4's chunked attention)."""
    t = torch.arange(length, device=device)[:, None]  # (L, 1) query index
    p = torch.arange(length, device=device)[None, :]  # (1, L) key index
    visible = p <= t
    if window is not None:
        visible = visible & (t - p < window)  # HF Mistral: kv_idx > q_idx - window
    if chunk is not None:
        visible = visible & (p // chunk == t // chunk)
    return visible  # (L, L)


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                 scale: float, is_gqa: bool, chunk: int | None = None) -> torch.Tensor:
    """Causal (optionally windowed or chunked) attention of one sequence in SDPA's
    (1, H, L, D) layout."""
    length = q.shape[2]
    if (window is None or window >= length) and (chunk is None or chunk >= length):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=is_gqa)
    mask = causal_window_mask(length, window, q.device, chunk)  # (L, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=is_gqa)


class DenseContext:
    """No-cache attention over sequences packed back to back in T.

    cu_seqlens: cumulative sequence lengths [0, L0, L0+L1, ..., T]; every token of a
    sequence is present (positions 0..L-1), each attends causally to its own tokens.
    config: needed only by models with linear-attention or SSM layers, whose
    temporary zero states (`state`) take their shapes from it.
    """

    def __init__(
        self, cu_seqlens: Sequence[int] | torch.Tensor, config: ModelConfig | None = None
    ) -> None:
        bounds = [int(x) for x in cu_seqlens]
        if len(bounds) < 2 or bounds[0] != 0 or any(b <= a for a, b in pairwise(bounds)):
            raise ValueError(f"cu_seqlens must start at 0 and increase strictly, got {bounds}")
        self.cu_seqlens = bounds
        self.config = config
        self.device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else None
        # K/V of the layers that own them, for CLA layers that read another layer's KV.
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def single(cls, num_tokens: int, config: ModelConfig | None = None) -> DenseContext:
        return cls([0, num_tokens], config)

    def state(self, layer: LayerSpec) -> LayerState:
        """Zero float32 state, one slot per packed sequence, discarded after the call."""
        from infbench.roofline.shapes import layer_state_entries

        if self.config is None:
            raise ValueError(
                f"layer {layer.index} ({layer.mixer}) keeps a recurrent state: build the "
                "context as DenseContext(cu_seqlens, config=model_config)"
            )
        num_seqs = len(self.cu_seqlens) - 1
        tensors = {
            name: torch.zeros(num_seqs, *shape, device=self.device)
            for name, shape in layer_state_entries(self.config, layer)
        }
        return LayerState(
            tensors=tensors,
            slots=torch.arange(num_seqs, device=self.device),
            cu_seqlens=torch.tensor(self.cu_seqlens, device=self.device),
            start_pos=torch.zeros(num_seqs, dtype=torch.long, device=self.device),
            num_decode=0,
        )

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def num_decode(self) -> int:
        """Every packed sequence is a whole prompt: no decode rows."""
        return 0

    def mla_prefill_latents(
        self, layer: LayerSpec, latent: torch.Tensor
    ) -> list[tuple[torch.Tensor, int]]:
        """Each packed sequence's own latent rows (no cache: the context is this call)."""
        if latent.shape[0] != self.num_tokens:
            raise ValueError(
                f"latent has {latent.shape[0]} tokens, cu_seqlens covers {self.num_tokens}")
        # (L_b, Dl + Dr) each; every row is a query
        return [(latent[start:end], end - start) for start, end in pairwise(self.cu_seqlens)]

    def attention(
        self,
        layer: LayerSpec,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if q.shape[0] != self.num_tokens:
            raise ValueError(f"q has {q.shape[0]} tokens, cu_seqlens covers {self.num_tokens}")
        if k is None or v is None:
            k, v = self._kv[layer.kv_source]
        else:
            self._kv[layer.index] = (k, v)
        out = torch.empty_like(q)  # (T, Hq, D)
        is_gqa = k.shape[1] != q.shape[1]
        for start, end in pairwise(self.cu_seqlens):
            # (1, H, L, D): SDPA's batch-heads-first layout for one sequence
            qs = q[start:end].transpose(0, 1).unsqueeze(0)
            ks = k[start:end].transpose(0, 1).unsqueeze(0)
            vs = v[start:end].transpose(0, 1).unsqueeze(0)
            if sinks is not None:  # SDPA has no sink column: the explicit softmax
                positions = torch.arange(end - start, device=q.device)[None]  # (1, L)
                out[start:end] = attention_ref(q[None, start:end], ks, vs, positions, scale,
                                               layer.window, layer.chunk, sinks)[0]
                continue
            if layer.softcap is not None:  # SDPA cannot cap scores: the explicit softmax
                out[start:end] = softcapped_attention(
                    q[start:end], ks[0], vs[0], torch.arange(end - start, device=q.device),
                    scale, layer.window, layer.softcap)
                continue
            o = _causal_sdpa(qs, ks, vs, layer.window, scale, is_gqa, layer.chunk)
            out[start:end] = o.squeeze(0).transpose(0, 1)  # (L, Hq, D)
        return out

    def mla_attention(
        self, layer: LayerSpec, q: torch.Tensor, latent: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """MLA as multi-query attention over each sequence's own latent rows (causal).

        q (T, H, Dl + Dr), latent (T, Dl + Dr) -> (T, H, Dl).  Without a config the split
        point Dl is unknown (LayerSpec does not carry it): the values are then the whole
        latent rows and the result (T, H, Dl + Dr), whose first Dl dims are MLA's.
        """
        if q.shape[0] != self.num_tokens:
            raise ValueError(f"q has {q.shape[0]} tokens, cu_seqlens covers {self.num_tokens}")
        if latent.shape != (q.shape[0], q.shape[2]):
            raise ValueError(f"latent {tuple(latent.shape)} does not match q {tuple(q.shape)}")
        rank = self.config.attention.kv_lora_rank if self.config is not None else q.shape[2]
        out = q.new_empty(q.shape[0], q.shape[1], rank)  # (T, H, Dl)
        for start, end in pairwise(self.cu_seqlens):
            qs = q[start:end].transpose(0, 1).unsqueeze(0)  # (1, H, L, Dl + Dr)
            ks = latent[None, None, start:end]  # (1, 1, L, Dl + Dr): one KV head
            vs = ks[..., :rank]  # (1, 1, L, Dl)
            o = _causal_sdpa(qs, ks, vs, layer.window, scale, True)
            out[start:end] = o.squeeze(0).transpose(0, 1)  # (L, H, Dl)
        return out
