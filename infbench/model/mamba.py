"""Mamba-1 mixer (selective state space), numerically the slow path of transformers' MambaMixer.

    x, z = in_proj(u)                       (T, d_inner) each
    x = silu(causal depthwise conv1d(x))    kernel d_conv, state: the last d_conv inputs
    dt, B, C = x_proj(x)                    (T, dt_rank), (T, d_state), (T, d_state)
    dt = softplus(dt_proj(dt))              (T, d_inner); A = -exp(A_log) (d_inner, d_state)
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,  y_t = C_t h_t + D x_t
    out = out_proj(y * silu(z))

Parameter names follow transformers (in_proj, conv1d, x_proj, dt_proj, A_log, D,
out_proj), so checkpoints load by name.  The conv runs over every token of the
step at once, each sequence prefixed by its stored last inputs (zeros for a new
one).  Decode steps go through `Ops.selective_state_update` (a Triton kernel on
GPU); prompts through `selective_scan` below, starting from the stored state
when a chunked prefill continues.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.model.context import AttentionContext, LayerState
from infbench.model.linear import make_linear
from infbench.model.linear_attention import padded_layout
from infbench.model.ops import Ops
from infbench.roofline.shapes import mamba_dims
from kernels.selective_scan import selective_state_update_ref


def selective_scan(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
    h0: torch.Tensor, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked scan over padded sequences; returns y = C.h (no D skip, no gate) and h_last.

    x, dt (after softplus; 0 on padding): (B, L, C), L a multiple of `chunk`;
    a: (C, N); b, c: (B, L, N); h0: (B, C, N).  All float32.

    Why this form: a plain time loop costs L sequential steps, and a fully parallel
    (Mamba-2 SSD-like) form needs a (chunk x chunk x d_inner x d_state) decay tensor,
    since A is diagonal per (channel, state) here and does not factor out.  Instead
    (1) a time loop *inside* chunks runs all chunks of all sequences at once from a
    zero state, (2) a loop over chunks carries the boundary states, and (3) each
    token adds C_t . (exp(sum of dt A since its chunk began) * h_chunk_start), the
    decay in closed form (log space, exponents <= 0, so no overflow).  Work stays
    O(L d_inner d_state) like the recurrence, with chunk + L / chunk sequential steps.
    Padding has dt = 0: decay 1 and no input, so the state passes through unchanged.
    """
    bsz, length, ch = x.shape
    n = length // chunk
    log_decay = (dt[..., None] * a).view(bsz, n, chunk, ch, -1)  # (B, n, Ck, C, N), <= 0
    inputs = ((dt[..., None] * b[:, :, None, :]) * x[..., None]).view_as(log_decay)
    cc = c.view(bsz, n, chunk, 1, -1)  # (B, n, Ck, 1, N)
    decay = log_decay.exp()
    h = x.new_zeros(bsz, n, ch, a.shape[1])  # (B, n, C, N): one local state per chunk
    y = x.new_empty(bsz, n, chunk, ch)
    for t in range(chunk):  # (1) local scans of every chunk in parallel
        h = decay[:, :, t] * h + inputs[:, :, t]
        y[:, :, t] = (h * cc[:, :, t]).sum(-1)
    cum_decay = log_decay.cumsum(2).exp()  # (B, n, Ck, C, N): decay since the chunk start
    carry, starts = h0, []
    for i in range(n):  # (2) state entering each chunk
        starts.append(carry)
        carry = cum_decay[:, i, -1] * carry + h[:, i]
    h_start = torch.stack(starts, dim=1)  # (B, n, C, N)
    y += (cum_decay * h_start[:, :, None] * cc).sum(-1)  # (3) the carried state's share
    return y.view(bsz, length, ch), carry


class MambaMixer(nn.Module):
    """Mamba-1 selective-scan mixer with per-sequence conv and SSM state slots."""

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
        d_inner, d_state, d_conv, dt_rank = mamba_dims(config)
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = d_inner, d_state, d_conv, dt_rank
        kw: dict[str, Any] = dict(quant=quant, dtype=dtype, device=device)
        self.in_proj = make_linear(config.hidden_size, 2 * d_inner, **kw)  # x rows, then z
        # Depthwise: weight (d_inner, 1, d_conv) as in the checkpoints; never called as a module.
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1,
                                dtype=dtype, device=device)
        self.x_proj = make_linear(d_inner, dt_rank + 2 * d_state, **kw)
        self.dt_proj = make_linear(dt_rank, d_inner, bias=True, **kw)
        self.A_log = nn.Parameter(torch.empty(d_inner, d_state, dtype=dtype, device=device))
        self.D = nn.Parameter(torch.empty(d_inner, dtype=dtype, device=device))
        self.out_proj = make_linear(d_inner, config.hidden_size, **kw)
        if self.A_log.device.type != "meta":
            with torch.no_grad():  # S4D-real init, as mamba_ssm: A = -(1..d_state), D = 1
                a_init = torch.arange(1, d_state + 1, dtype=torch.float32).log()
                self.A_log.copy_(a_init.expand(d_inner, -1))
                self.D.fill_(1.0)
        self.state_update_fn = selective_state_update_ref

    def set_ops(self, ops: Ops) -> None:
        self.state_update_fn = ops.selective_state_update

    @property
    def _dt_bias(self) -> torch.Tensor:
        return cast(torch.Tensor, self.dt_proj.bias)  # (d_inner,)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        rope_cache: torch.Tensor,
    ) -> torch.Tensor:
        st = ctx.state(self.layer)
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (T, d_inner) each
        xs = F.silu(self._conv(xs, st)).to(x.dtype)  # (T, d_inner)
        dt, b, c = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        # dt_proj's bias goes inside the softplus (transformers' order): weight alone here.
        dt = F.linear(dt, cast(torch.Tensor, self.dt_proj.weight))  # (T, d_inner)
        a = -torch.exp(self.A_log.float())  # (d_inner, d_state)
        y = torch.empty(x.shape[0], self.d_inner, device=x.device)  # (T, d_inner) float32
        nd = st.num_decode
        if nd:
            y[:nd] = self.state_update_fn(xs[:nd], dt[:nd], a, b[:nd], c[:nd], self.D, z[:nd],
                                          self._dt_bias, st.tensors["ssm"], st.slots[:nd])
        if nd < len(st.slots):
            y[nd:] = self._prefill(xs[nd:], dt[nd:], a, b[nd:], c[nd:], z[nd:], st)
        return self.out_proj(y.to(x.dtype))  # (T, hidden)

    def _conv(self, xs: torch.Tensor, st: LayerState) -> torch.Tensor:
        """Causal depthwise conv of every token, each sequence after its last d_conv - 1
        inputs (zeros at position 0); stores the new last d_conv inputs.  (T, C) float32."""
        k = self.d_conv
        cu, slots = st.cu_seqlens.to(xs.device), st.slots  # slots index the state's device
        num_seqs, device = len(slots), xs.device
        lengths = cu[1:] - cu[:-1]  # (B,)
        conv_state = st.tensors["conv"]  # (num_slots, C, k): the last k inputs, oldest first
        carried = (st.start_pos > 0).to(device)[:, None, None]
        prev = torch.where(carried, conv_state[slots].to(device, torch.float32), 0.0)
        # ext holds one block per sequence: its k - 1 previous inputs, then its new tokens.
        seq_ids = torch.arange(num_seqs, device=device)
        block_start = cu[:-1] + seq_ids * (k - 1)  # (B,) first ext row of each block
        block_end = block_start + (k - 1) + lengths  # (B,) one past each block
        seq_of_token = torch.repeat_interleave(seq_ids, lengths)  # (T,)
        token_rows = torch.arange(xs.shape[0], device=device) + (seq_of_token + 1) * (k - 1)
        hist_rows = block_start[:, None] + torch.arange(k - 1, device=device)  # (B, k - 1)
        ext = xs.new_empty(xs.shape[0] + num_seqs * (k - 1), self.d_inner, dtype=torch.float32)
        ext[token_rows] = xs.float()
        ext[hist_rows.reshape(-1)] = prev[:, :, 1:].transpose(1, 2).reshape(-1, self.d_inner)
        windows = token_rows[:, None] - (k - 1) + torch.arange(k, device=device)  # (T, k)
        weight = self.conv1d.weight.float().squeeze(1)  # (C, k)
        out = torch.einsum("tkc,ck->tc", ext[windows], weight)
        if self.conv1d.bias is not None:
            out += self.conv1d.bias.float()
        last = block_end[:, None] - k + torch.arange(k, device=device)  # (B, k): last k rows
        conv_state[slots] = ext[last].transpose(1, 2).to(conv_state)
        return out

    def _prefill(self, xs: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 c: torch.Tensor, z: torch.Tensor, st: LayerState) -> torch.Tensor:
        """Selective scan of the prompt sequences (those after the decodes).  (T, C) float32."""
        nd = st.num_decode
        cu = (st.cu_seqlens[nd:] - st.cu_seqlens[nd]).to(xs.device)
        slots, start = st.slots[nd:], st.start_pos[nd:]
        # chunk ~ sqrt(longest) minimizes the chunk + L / chunk sequential steps.
        chunk = math.isqrt(int((cu[1:] - cu[:-1]).max()) - 1) + 1
        index, valid = padded_layout(cu, chunk)  # (B, L_pad)
        mask = valid[..., None]
        step = F.softplus(dt.float() + self._dt_bias.float())  # (T, C)
        xp, stepp = xs.float()[index] * mask, step[index] * mask  # (B, L_pad, C), zero padded
        bp, cp = b.float()[index], c.float()[index]  # (B, L_pad, N)
        ssm_state = st.tensors["ssm"]  # (num_slots, C, N)
        carried = (start > 0).to(xs.device)[:, None, None]
        h0 = torch.where(carried, ssm_state[slots].to(xs.device, torch.float32), 0.0)
        y, h_last = selective_scan(xp, stepp, a, bp, cp, h0, chunk)
        ssm_state[slots] = h_last.to(ssm_state)
        y = y[valid] + xs.float() * self.D.float()  # (T, C): the D skip connection
        return y * F.silu(z.float())
