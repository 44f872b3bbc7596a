"""How the model asks for attention: the `AttentionContext` protocol and a dense reference.

The model computes q, k, v for all T tokens of a step and hands them to the
context; the context knows which tokens belong to which sequence, where their
KV cache lives and what the layer's window is.  The engine's paged context
implements the same method.  `DenseContext` keeps no cache: it attends over the
tokens of this call only, which is the "full recompute" reference for tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Protocol

import torch
import torch.nn.functional as F

from infbench.config import LayerSpec


class AttentionContext(Protocol):
    """Per-step attention over the flattened batch."""

    def attention(
        self,
        layer: LayerSpec,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) or None when `layer` reads `layer.kv_source`'s KV.

        Returns (T, Hq, D).
        """
        ...


def causal_window_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Boolean (L, L) mask, True where key p is visible to query t: p <= t and t - p < window."""
    t = torch.arange(length, device=device)[:, None]  # (L, 1) query index
    p = torch.arange(length, device=device)[None, :]  # (1, L) key index
    visible = p <= t
    if window is not None:
        visible = visible & (t - p < window)  # HF Mistral: kv_idx > q_idx - window
    return visible  # (L, L)


class DenseContext:
    """No-cache attention over sequences packed back to back in T.

    cu_seqlens: cumulative sequence lengths [0, L0, L0+L1, ..., T]; every token of a
    sequence is present (positions 0..L-1), each attends causally to its own tokens.
    """

    def __init__(self, cu_seqlens: Sequence[int] | torch.Tensor) -> None:
        bounds = [int(x) for x in cu_seqlens]
        if len(bounds) < 2 or bounds[0] != 0 or any(b <= a for a, b in pairwise(bounds)):
            raise ValueError(f"cu_seqlens must start at 0 and increase strictly, got {bounds}")
        self.cu_seqlens = bounds
        # K/V of the layers that own them, for CLA layers that read another layer's KV.
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def single(cls, num_tokens: int) -> DenseContext:
        return cls([0, num_tokens])

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def attention(
        self,
        layer: LayerSpec,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
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
            length = end - start
            if layer.window is None or layer.window >= length:
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=scale, enable_gqa=is_gqa
                )
            else:
                mask = causal_window_mask(length, layer.window, q.device)  # (L, L)
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=is_gqa
                )
            out[start:end] = o.squeeze(0).transpose(0, 1)  # (L, Hq, D)
        return out
