"""Grouped SwiGLU experts over the (token, expert) pairs of a top-k routing.

Each token picks k experts; the T*k pairs are sorted by expert id so every expert reads its
weights once and multiplies them with the contiguous slice of its tokens (vLLM's fused
MoE layout).  `moe_align` pads each expert's slice to a multiple of the tile height, so one
tile of rows belongs to one expert; padding rows hold the sentinel pair id T*k.

- `_moe_gate_up_kernel`: per tile of sorted pairs, x[token] @ w13[e].T for the gate and
  the up halves, SiLU(gate) * up written to an (padded pairs, I) buffer.
- `_moe_down_kernel`: that buffer @ w2[e].T times the pair's routing weight, stored at the
  pair's own row of a (T*k, H) buffer; the k rows of a token are summed afterwards in a
  fixed order (no atomics, so a token's result does not depend on the rest of the batch).

`fused_moe_ref` is the reference and the engine's CPU path: a loop over the experts that
got tokens, `index_select` of their tokens, the SwiGLU, `index_add` back with the weights.
It also runs experts stored as fp8 / mxfp4 / nvfp4 codes (`StackedExperts`, w13 and w2 of
`model/float_quant.StackedFloatCodes`): only the expert being computed is decoded, a slice
of rows at a time (`kernels/cpu_fp_linear.py`), for the tokens routed to it.
Shapes: x (T, H), w13 (E, 2I, H) (gate rows first, then up), w2 (E, H, I), weights and
ids (T, k).

gpt-oss's experts (`ExpertAct`): biases b13 (E, 2I) on the gate/up outputs and b2 (E, H)
on the down output, and the clamped SwiGLU instead of SiLU(gate) * up: gate clamped to
<= limit, up to [-limit, limit], then gate * sigmoid(alpha * gate) * (up + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import dot_precision, is_compiled
from kernels.cost import KernelCost
from kernels.cpu_fp_linear import cpu_fp_linear
from kernels.fp_format import FloatQuantWeight

ACTIVATIONS = ("silu", "clamped_swiglu")


@dataclass(frozen=True)
class ExpertAct:
    """The experts' gated activation and biases: silu is SiLU(gate) * up (no biases);
    clamped_swiglu is gpt-oss's, with `alpha` and `limit`."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0
    b13: torch.Tensor | None = None  # (E, 2I) gate then up biases
    b2: torch.Tensor | None = None  # (E, H) down biases

    def __post_init__(self) -> None:
        assert self.kind in ACTIVATIONS, f"activation {self.kind!r}; allowed: {ACTIVATIONS}"
        assert (self.b13 is None) == (self.b2 is None), "b13 and b2 come together"

    def gate_up(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The gated activation of (n, I) gate and up (biases already added), in float32."""
        gate, up = gate.float(), up.float()
        if self.kind == "silu":
            return F.silu(gate) * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return gate * torch.sigmoid(self.alpha * gate) * (up + 1.0)


SILU = ExpertAct()


@dataclass(frozen=True)
class Alignment:
    """The sorted (token, expert) pairs, padded per expert to the tile height."""

    sorted_pairs: torch.Tensor  # (max_rows,) int32 pair ids t*k + j, sentinel T*k = padding
    block_expert: torch.Tensor  # (max_rows // block_m,) int32 expert of a tile, -1 unused
    counts: torch.Tensor  # (E,) int64 pairs per expert
    block_m: int


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the pairs of ids (T, k) by expert; worst-case sized so nothing is synchronized."""
    flat = ids.reshape(-1)  # (P,) expert of each pair, P = T*k
    num_pairs = flat.numel()
    order = torch.argsort(flat, stable=True)  # pair ids grouped by expert, in token order
    counts = torch.bincount(flat, minlength=num_experts)  # (E,)
    padded = (counts + block_m - 1) // block_m * block_m
    start = torch.cumsum(counts, 0) - counts  # first sorted index of each expert
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    max_rows = (num_pairs + num_experts * (block_m - 1) + block_m - 1) // block_m * block_m
    expert_of = flat[order]  # (P,)
    rank = torch.arange(num_pairs, device=ids.device) - start[expert_of]
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=ids.device)
    sorted_pairs[padded_start[expert_of] + rank] = order.to(torch.int32)
    tile_start = torch.arange(0, max_rows, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_end, tile_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return Alignment(sorted_pairs, block_expert, counts, block_m)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr, w13_ptr, inter_ptr, sorted_ptr, block_expert_ptr, b13_ptr,
    num_pairs, top_k, hidden, inter_size, alpha, limit,
    stride_xt, stride_we, stride_wn, stride_ir, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    is_pair = pairs < num_pairs
    tokens = tl.where(is_pair, pairs // top_k, 0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter_size
    w_base = w13_ptr + expert.to(tl.int64) * stride_we
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + ks[None, :],
                    mask=is_pair[:, None] & k_ok[None, :], other=0.0)  # (BM, BK)
        wg = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None],
                     mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # (BK, BN)
        wu = tl.load(w_base + (cols[None, :] + inter_size) * stride_wn + ks[:, None],
                     mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # (BK, BN)
        gate += tl.dot(a, wg, input_precision=DOT_PRECISION)
        up += tl.dot(a, wu, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        b_base = b13_ptr + expert.to(tl.int64) * stride_be
        gate += tl.load(b_base + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        up += tl.load(b_base + inter_size + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if CLAMPED:  # gpt-oss: clamp, then gate * sigmoid(alpha * gate) * (up + 1)
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = gate * tl.sigmoid(alpha * gate) * (up + 1.0)
    else:
        h = gate * tl.sigmoid(gate) * up
    tl.store(inter_ptr + rows[:, None] * stride_ir + cols[None, :],
             h.to(inter_ptr.dtype.element_ty), mask=is_pair[:, None] & col_ok[None, :])


@triton.jit
def _moe_down_kernel(
    inter_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ptr, block_expert_ptr, b2_ptr,
    num_pairs, hidden, inter_size,
    stride_ir, stride_we, stride_wn, stride_or, stride_be,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    is_pair = pairs < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_base = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inter_size
        a = tl.load(inter_ptr + rows[:, None] * stride_ir + ks[None, :],
                    mask=is_pair[:, None] & k_ok[None, :], other=0.0)  # (BM, BK)
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # (BK, BN)
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = tl.load(b2_ptr + expert.to(tl.int64) * stride_be + cols, mask=col_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    scale = tl.load(weights_ptr + pairs, mask=is_pair, other=0.0)  # (BM,) routing weights
    acc = acc * scale[:, None]
    tl.store(out_ptr + pairs[:, None].to(tl.int64) * stride_or + cols[None, :], acc,
             mask=is_pair[:, None] & col_ok[None, :])


def _tiles(x: torch.Tensor) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): small tiles under the interpreter (one program at a
    time), tensor-core sized ones when compiled."""
    return (32, 64, 64) if is_compiled(x) else (16, 16, 16)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor, act: ExpertAct = SILU) -> torch.Tensor:
    """Routed experts of x (T, H): sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) -> (T, H)."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, hidden_w = w13.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    assert hidden_w == hidden and w2.shape == (num_experts, hidden, inter), (w13.shape, w2.shape)
    assert weights.shape == ids.shape == (num_tokens, top_k)
    assert x.dtype == w13.dtype == w2.dtype and x.is_contiguous()
    assert w13.is_contiguous() and w2.is_contiguous()
    has_bias = act.b13 is not None and act.b2 is not None
    if has_bias:
        assert act.b13 is not None and act.b2 is not None
        assert act.b13.shape == (num_experts, two_inter) and act.b2.shape == (num_experts, hidden)
        assert act.b13.stride(1) == 1 and act.b2.stride(1) == 1
    b13 = act.b13 if act.b13 is not None else w13  # never read without biases
    b2 = act.b2 if act.b2 is not None else w2
    block_m, block_n, block_k = _tiles(x)
    prec = dot_precision(x.dtype)
    align = moe_align(ids, num_experts, block_m)
    max_rows = align.sorted_pairs.numel()
    num_pairs = num_tokens * top_k
    inter_buf = torch.empty(max_rows, inter, dtype=x.dtype, device=x.device)  # (rows, I)
    grid = (max_rows // block_m, triton.cdiv(inter, block_n))
    _moe_gate_up_kernel[grid](
        x, w13, inter_buf, align.sorted_pairs, align.block_expert, b13,
        num_pairs, top_k, hidden, inter, float(act.alpha), float(act.limit),
        x.stride(0), w13.stride(0), w13.stride(1), inter_buf.stride(0), b13.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=prec,
        HAS_BIAS=has_bias, CLAMPED=act.kind == "clamped_swiglu",
    )
    pair_out = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)  # (P, H)
    flat_weights = weights.reshape(-1).float().contiguous()  # (P,)
    grid = (max_rows // block_m, triton.cdiv(hidden, block_n))
    _moe_down_kernel[grid](
        inter_buf, w2, pair_out, flat_weights, align.sorted_pairs, align.block_expert, b2,
        num_pairs, hidden, inter,
        inter_buf.stride(0), w2.stride(0), w2.stride(1), pair_out.stride(0), b2.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=prec,
        HAS_BIAS=has_bias,
    )
    # The k contributions of a token in slot order: the same sum whatever the batch.
    return pair_out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)  # (T, H)


class StackedExperts(Protocol):
    """Expert matrices (E, N, K) stored in a float code format: `expert(e)` decodes."""

    @property
    def shape(self) -> tuple[int, int, int]: ...

    def expert(self, e: int) -> FloatQuantWeight: ...


Experts = torch.Tensor | StackedExperts


def _expert_linear(xs: torch.Tensor, w: Experts, expert: int,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """xs (n, K) @ W_expert^T [+ bias]: a float stack's slice, or the stored codes of one
    expert decoded a slice of rows at a time."""
    if isinstance(w, torch.Tensor):
        return F.linear(xs, w[expert], bias)
    return cpu_fp_linear(xs, w.expert(expert), bias)


def fused_moe_ref(x: torch.Tensor, w13: Experts, w2: Experts, weights: torch.Tensor,
                  ids: torch.Tensor, act: ExpertAct = SILU) -> torch.Tensor:
    """The torch reference (and CPU path): experts in id order over their sorted tokens.
    w13 / w2: float (E, N, K) stacks, or experts stored as codes (`StackedExperts`)."""
    num_tokens, top_k = ids.shape
    inter = w13.shape[1] // 2
    flat = ids.reshape(-1)  # (P,)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    flat_weights = weights.reshape(-1)  # (P,)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)  # (T, H)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start:start + count]  # this expert's contiguous slice
        start += count
        tokens = pairs // top_k
        xs = x.index_select(0, tokens)  # (n, H)
        b13 = act.b13[expert] if act.b13 is not None else None
        b2 = act.b2[expert] if act.b2 is not None else None
        gate, up = _expert_linear(xs, w13, expert, b13).split(inter, dim=-1)  # (n, I) each
        if act.kind == "silu" and b13 is None:
            ys = _expert_linear(F.silu(gate) * up, w2, expert, None)  # (n, H)
        else:
            ys = _expert_linear(act.gate_up(gate, up).to(x.dtype), w2, expert, b2)  # (n, H)
        out.index_add_(0, tokens, ys.float() * flat_weights[pairs, None].float())
    return out.to(x.dtype)


def fused_moe_cost(num_tokens: int, top_k: int, hidden: int, inter: int,
                   experts_touched: int, dtype_bytes: int) -> KernelCost:
    """FLOPs and bytes of one call: each pair runs a SwiGLU; each touched expert's weights
    are read once; activations read per pair and the (T*k, H) float32 partials once."""
    pairs = num_tokens * top_k
    flops = pairs * (6.0 * hidden * inter + 4.0 * inter)
    weights = experts_touched * 3 * hidden * inter * dtype_bytes
    acts = pairs * (hidden + 2 * inter) * dtype_bytes + pairs * hidden * 4
    acts += num_tokens * hidden * dtype_bytes  # the summed output
    return KernelCost(flops=flops, bytes=float(weights + acts))
