"""Causal linear attention (Katharopoulos et al., 2020) with four feature maps.

    o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps),
    S_t = sum_{i<=t} phi(k_i) v_i^T,  z_t = sum_{i<=t} phi(k_i)

Feature maps phi (`AttentionConfig.feature_map`), sizes from `roofline.shapes.feature_dim`:

- elu: elu(x) + 1; relu: max(x, 0) (elementwise, f = head_dim).
- favor: Performer's FAVOR+ positive random features exp(w.x - |x|^2/2) / sqrt(m) on
  x / d^(1/4), with m block-orthogonal Gaussian rows w drawn from a generator
  seeded by the layer index: a non-persistent buffer derived from the config,
  so every load of a checkpoint gives the same map.
- taylor: the 2nd-order Taylor map of exp(q.k / sqrt(d)) used by Based / Hedgehog,
  [1, x / d^(1/4), x (x) x / (sqrt(2) sqrt(d))], stored in its symmetric form
  (x_i x_j once for i < j, scaled by sqrt(2)): 1 + d + d(d+1)/2 features, the same
  dot products as the full d^2 form with about half the state.

Prefill uses the chunked parallel form (as in fla's `chunk` kernels): inside a
chunk a masked quadratic phi(Q) phi(K)^T, across chunks the running state.
Decode uses the recurrent form through `Ops.linear_attention_decode` (a Triton
kernel on GPU).  Both read and write the layer's state slots from
`ctx.state(layer)`, so a prompt prefilled in chunks continues from its state.
Math is float32; the state is stored in the engine's dtype.  GQA: k and v are
shared by a group of query heads, and S, z are kept per query head (the layout
`layer_state_entries` prices).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.model.context import AttentionContext, LayerState
from infbench.model.linear import make_linear
from infbench.model.ops import Ops
from infbench.roofline.shapes import feature_dim
from kernels.linear_attention import linear_attention_decode_ref

CHUNK_SIZE = 64
EPS = 1e-6
FAVOR_SEED = 0x5EED  # + layer index: a fixed, reproducible random projection per layer


def padded_layout(cu_seqlens: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed tokens -> a (B, L_pad) grid, L_pad a multiple of `chunk` covering the longest.

    Returns (index, valid): index[b, j] is the packed row of token j of sequence b
    (0 where j is padding), valid marks real tokens.  `x[index] * valid` pads with
    zeros; `grid[valid]` packs back in the original token order.
    """
    starts, lengths = cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1]  # (B,) each
    max_len = int(lengths.max())
    padded = math.ceil(max_len / chunk) * chunk
    offsets = torch.arange(padded, device=cu_seqlens.device)  # (L_pad,)
    valid = offsets[None, :] < lengths[:, None]  # (B, L_pad)
    index = torch.where(valid, starts[:, None] + offsets[None, :], 0)
    return index, valid


def _favor_projection(num_features: int, head_dim: int, seed: int) -> torch.Tensor:
    """(m, d) block-orthogonal Gaussian rows, each scaled to a chi(d)-distributed norm."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(num_features / head_dim)):
        q, r = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=gen))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # orthonormal rows, unique signs
    rows = torch.cat(blocks)[:num_features]  # (m, d)
    norms = torch.randn(num_features, head_dim, generator=gen).norm(dim=1)  # (m,)
    return rows * norms[:, None]


def feature_map(x: torch.Tensor, kind: str, projection: torch.Tensor | None = None) -> torch.Tensor:
    """phi(x): (..., d) -> (..., f) in float32."""
    x = x.float()
    d = x.shape[-1]
    if kind == "elu":
        return F.elu(x) + 1.0
    if kind == "relu":
        return F.relu(x)
    if kind == "favor":
        assert projection is not None, "favor needs its random projection"
        x = x * d**-0.25  # exp(q.k / sqrt(d)) is the kernel approximated
        # No max-subtraction stabilizer: a per-key one would not survive streaming.
        logits = x @ projection.T - 0.5 * (x * x).sum(-1, keepdim=True)  # (..., m)
        return torch.exp(logits) * projection.shape[0] ** -0.5
    if kind == "taylor":
        i, j = torch.triu_indices(d, d, device=x.device)  # the pairs i <= j
        scale = torch.where(i == j, 0.5**0.5, 1.0) / math.sqrt(d)
        second = x[..., i] * x[..., j] * scale  # (..., d(d+1)/2)
        ones = torch.ones_like(x[..., :1])
        return torch.cat([ones, x * d**-0.25, second], dim=-1)
    raise ValueError(f"unknown feature map {kind!r}")


def chunked_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s0: torch.Tensor, z0: torch.Tensor,
    chunk: int, eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Parallel chunked form over padded sequences (padding rows of k and v must be zero).

    q, k: (B, L, H, f); v: (B, L, H, d), L a multiple of `chunk`; s0: (B, H, f, d) and
    z0: (B, H, f) the states before token 0.  Returns out (B, L, H, d), S and z after
    the last token.  All float32.
    """
    bsz, length, heads, f = q.shape
    n = length // chunk
    qc = q.view(bsz, n, chunk, heads, f).permute(0, 3, 1, 2, 4)  # (B, H, n, C, f)
    kc = k.view(bsz, n, chunk, heads, f).permute(0, 3, 1, 2, 4)
    vc = v.view(bsz, n, chunk, heads, -1).permute(0, 3, 1, 2, 4)  # (B, H, n, C, d)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (B, H, n, C, C)
    kv = kc.transpose(-1, -2) @ vc  # (B, H, n, f, d): each chunk's phi(K)^T V
    ksum = kc.sum(3)  # (B, H, n, f)
    # State before each chunk: s0 plus every earlier chunk (an exclusive prefix sum).
    s_incl = s0[:, :, None] + kv.cumsum(2)  # (B, H, n, f, d)
    z_incl = z0[:, :, None] + ksum.cumsum(2)  # (B, H, n, f)
    s_prev = torch.cat([s0[:, :, None], s_incl[:, :, :-1]], dim=2)
    z_prev = torch.cat([z0[:, :, None], z_incl[:, :, :-1]], dim=2)
    num = scores @ vc + qc @ s_prev  # (B, H, n, C, d)
    den = scores.sum(-1) + (qc @ z_prev[..., None]).squeeze(-1)  # (B, H, n, C)
    out = num / (den[..., None] + eps)
    out = out.permute(0, 2, 3, 1, 4).reshape(bsz, length, heads, -1)  # (B, L, H, d)
    return out, s_incl[:, :, -1], z_incl[:, :, -1]


class LinearAttention(nn.Module):
    """Linear-attention mixer: fused qkv (GQA allowed), no RoPE, one of four feature maps."""

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
        self.kind = config.attention.feature_map
        self.num_features = feature_dim(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        kw: dict[str, Any] = dict(quant=quant, dtype=dtype, device=device)
        self.qkv_proj = make_linear(config.hidden_size, sum(self.split_sizes), **kw)
        self.o_proj = make_linear(q_size, config.hidden_size, **kw)
        # FAVOR+ rows (m, d); not persistent: derived from (config, layer), never in a checkpoint.
        proj = self._projection(device) if self.kind == "favor" else None
        self.projection: torch.Tensor | None
        self.register_buffer("projection", proj, persistent=False)
        self.decode_fn = linear_attention_decode_ref

    def _projection(self, device: Any) -> torch.Tensor:
        proj = _favor_projection(self.num_features, self.head_dim, FAVOR_SEED + self.layer.index)
        return proj.to(device)  # (m, d) float32

    def init_buffers(self) -> None:
        """Recompute the FAVOR+ projection (after `to_empty` left it uninitialized)."""
        if self.projection is not None:
            self.projection = self._projection(self.projection.device)

    def set_ops(self, ops: Ops) -> None:
        self.decode_fn = ops.linear_attention_decode

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(T, heads, d) -> (T, heads, f) float32."""
        return feature_map(x, self.kind, self.projection)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # (T, H, d)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, Hkv, d)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        group = self.num_heads // self.num_kv_heads
        # phi at the KV heads, then shared by each group of query heads: (T, H, f) / (T, H, d)
        q_feat = self.features(q)
        k_feat = self.features(k).repeat_interleave(group, dim=1)
        v32 = v.float().repeat_interleave(group, dim=1)
        st = ctx.state(self.layer)
        out = torch.empty(num_tokens, self.num_heads, self.head_dim, device=x.device)
        nd = st.num_decode
        if nd:
            out[:nd] = self.decode_fn(q_feat[:nd], k_feat[:nd], v32[:nd], st.tensors["S"],
                                      st.tensors["z"], st.slots[:nd], EPS)
        if nd < len(st.slots):
            out[nd:] = self._prefill(q_feat[nd:], k_feat[nd:], v32[nd:], st)
        return self.o_proj(out.to(x.dtype).reshape(num_tokens, -1))  # (T, hidden)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 st: LayerState) -> torch.Tensor:
        """Chunked form for the prompt sequences (those after the decodes)."""
        nd = st.num_decode
        # (B + 1,) offsets into q, k, v; the layout lives with the activations, the slots
        # with the state (a DenseContext may keep its temporary state elsewhere).
        cu = (st.cu_seqlens[nd:] - st.cu_seqlens[nd]).to(q.device)
        slots, start = st.slots[nd:], st.start_pos[nd:]
        chunk = min(CHUNK_SIZE, int((cu[1:] - cu[:-1]).max()))
        index, valid = padded_layout(cu, chunk)  # (B, L_pad)
        mask = valid[..., None, None]
        qp, kp, vp = (t[index] * mask for t in (q, k, v))  # (B, L_pad, H, f|d), zero padded
        s_all, z_all = st.tensors["S"], st.tensors["z"]
        # A sequence that starts at position 0 (new, or recomputed after preemption)
        # starts from zero whatever its slot held before.
        carried = (start > 0).to(q.device)  # (B,)
        s_prev = s_all[slots].to(q.device, torch.float32)  # (B, H, f, d)
        s0 = torch.where(carried[:, None, None, None], s_prev, 0.0)
        z0 = torch.where(carried[:, None, None], z_all[slots].to(q.device, torch.float32), 0.0)
        out, s_new, z_new = chunked_linear_attention(qp, kp, vp, s0, z0, chunk)
        s_all[slots] = s_new.to(s_all)
        z_all[slots] = z_new.to(z_all)
        return out[valid]  # (T_prefill, H, d)
