"""One device's share of a step under tensor / pipeline / expert parallelism, and the
collectives between devices.

Per-device costs come from the single-device operator costs (`costs.group_costs`) scaled
by how each operator is split (`ParallelConfig` documents the split):

- split `tp` ways (FLOPs, weights, activations): the projections, attention, the MLP and
  experts, linear attention and SSM operators, the vocabulary-parallel embedding gather
  and LM head;
- not split: norms and the MoE router (every device runs them on the whole hidden state);
- KV reads and writes: `kv_share` (1 / tp; 1 / kv_heads when each device keeps one whole
  KV head; 1 for MLA, whose latent cache every device holds).

Collectives, `n` devices, message `S` bytes, link bandwidth `B` per direction and latency
`a` per hop (`Interconnect.tier` picks NVLink / PCIe / network by the group's span):

- all-reduce (ring): 2 (n - 1) / n * S / B + 2 (n - 1) a
- all-gather and all-to-all: (n - 1) / n * S / B + (n - 1) a
- a pipeline hop: S / B + a

Communication is not overlapped with compute: each collective sits between two
operators that need its result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.parallel import ParallelConfig
from infbench.hardware.spec import HardwareSpec, MemoryReserve
from infbench.roofline.costs import group_costs
from infbench.roofline.ops import OpCost, SeqWork
from infbench.roofline.shapes import (
    dtype_bytes,
    has_mlp,
    is_moe_layer,
    layer_kv_bytes_per_token,
    layer_state_bytes,
    layer_weights,
    model_weights,
)

REPLICATED_OPS = ("norm", "moe_router")  # every tensor-parallel device runs these whole


def kv_share(cfg: ModelConfig, tp: int) -> float:
    """The fraction of the KV cache (reads, writes, bytes held) one of `tp` devices has."""
    if tp == 1:
        return 1.0
    if cfg.attention.kind == "mla":
        return 1.0  # the latent is shared by all heads: every device keeps all of it
    kvh = cfg.kv_heads
    return 1.0 / tp if kvh >= tp else 1.0 / kvh


def shard_ops(cfg: ModelConfig, ops: Iterable[OpCost], tp: int) -> list[OpCost]:
    """One tensor-parallel device's share of each operator (identity when tp is 1)."""
    ops = list(ops)
    if tp == 1:
        return ops
    kv = kv_share(cfg, tp)
    out = []
    for op in ops:
        part = 1.0 if op.name in REPLICATED_OPS else 1.0 / tp
        out.append(replace(
            op, flops=op.flops * part, weight_bytes=op.weight_bytes * part,
            act_bytes=op.act_bytes * part, state_bytes=op.state_bytes * part,
            kv_read_bytes=op.kv_read_bytes * kv, kv_write_bytes=op.kv_write_bytes * kv))
    return out


# ------------------------------------------------------------------ collectives
@dataclass(frozen=True)
class CommTime:
    """Seconds of one step's communication on one device, by kind."""

    all_reduce_s: float = 0.0
    all_gather_s: float = 0.0
    all_to_all_s: float = 0.0
    pipeline_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.all_reduce_s + self.all_gather_s + self.all_to_all_s + self.pipeline_s

    def plus(self, other: CommTime) -> CommTime:
        return CommTime(self.all_reduce_s + other.all_reduce_s,
                        self.all_gather_s + other.all_gather_s,
                        self.all_to_all_s + other.all_to_all_s,
                        self.pipeline_s + other.pipeline_s)


def _link(hw: HardwareSpec, group: int, span: int) -> tuple[float, float]:
    if hw.interconnect is None:
        raise ConfigError(f"hardware {hw.name!r} has no interconnect figures (a calibrated "
                          "profile is one device); pick a table entry for parallel predictions")
    _, bw, latency = hw.interconnect.tier(group, span)
    return bw, latency


def all_reduce_s(nbytes: float, n: int, hw: HardwareSpec, span: int | None = None) -> float:
    """Ring all-reduce of `nbytes` over `n` devices."""
    if n <= 1:
        return 0.0
    bw, latency = _link(hw, n, span or n)
    return 2.0 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * latency


def all_gather_s(nbytes: float, n: int, hw: HardwareSpec, span: int | None = None) -> float:
    """Ring all-gather (or an all-to-all) of `nbytes` in total over `n` devices."""
    if n <= 1:
        return 0.0
    bw, latency = _link(hw, n, span or n)
    return (n - 1) / n * nbytes / bw + (n - 1) * latency


def hop_s(nbytes: float, span: int, hw: HardwareSpec) -> float:
    """One point-to-point transfer between devices `span` apart in the placement."""
    bw, latency = _link(hw, 2, span)
    return nbytes / bw + latency


def stage_comm(cfg: ModelConfig, par: ParallelConfig, hw: HardwareSpec, dtype: str,
               specs: Sequence[LayerSpec], num_tokens: int, num_logits: int, first: bool,
               last: bool) -> CommTime:
    """The collectives of one pipeline stage's forward over `num_tokens` tokens."""
    tp, ep = par.tp, par.ep
    if tp == 1:
        return CommTime()
    a = dtype_bytes(dtype)
    hidden = num_tokens * cfg.hidden_size * a
    one_reduce = all_reduce_s(hidden, tp, hw)
    reduces = 1 if first else 0  # the vocabulary-parallel embedding's partial rows
    to_all = 0.0
    for spec in specs:
        reduces += 1  # after the mixer's output projection
        if not has_mlp(cfg):
            continue
        if ep > 1 and is_moe_layer(cfg, spec):
            moe = cfg.moe
            assert moe is not None
            routed = hidden * moe.num_experts_per_tok
            to_all += 2 * all_gather_s(routed, ep, hw, span=tp)  # dispatch + combine
            if tp > ep:  # each expert is sliced over tp / ep devices
                to_all += all_reduce_s(routed / ep, tp // ep, hw, span=tp)
        else:
            reduces += 1  # after the MLP's down projection
    gather = all_gather_s(num_logits * cfg.vocab_size * a, tp, hw) if last else 0.0
    return CommTime(all_reduce_s=reduces * one_reduce, all_gather_s=gather, all_to_all_s=to_all)


# ------------------------------------------------------------------ memory per device
def stage_weight_bytes(cfg: ModelConfig, dtype: str, quant: QuantConfig | None, tp: int,
                       specs: Sequence[LayerSpec], first: bool, last: bool) -> int:
    """Weights one device of a stage holds: the split tensors / tp, the replicated whole."""
    q = quant or QuantConfig()
    a = dtype_bytes(dtype)
    ws = [w for spec in specs for w in layer_weights(cfg, spec)]
    top = model_weights(cfg, q)
    tied_head = len(top) == 2  # embed + final norm: the tied embedding is the head
    for w in top:
        if (w.op == "embed" and (first or (last and tied_head))) or \
                (w.op != "embed" and last):
            ws.append(w)
    return math.ceil(sum(w.nbytes(q, a) / (1 if w.op in REPLICATED_OPS else tp) for w in ws))


def stage_kv_bytes_per_seq(cfg: ModelConfig, dtype: str, quant: QuantConfig | None, tp: int,
                           specs: Sequence[LayerSpec], context_len: int) -> int:
    """KV + constant state of one sequence on one device of a stage."""
    q = quant or QuantConfig()
    a = dtype_bytes(dtype)
    kvb = q.kv_bytes(a)
    share = kv_share(cfg, tp)
    kv = 0.0
    state = 0.0
    for spec in specs:
        held = spec.kv_held(context_len)
        kv += layer_kv_bytes_per_token(cfg, spec, kvb, q.kv_scale_bytes) * held * share
        state += layer_state_bytes(cfg, spec, a) / tp
    return math.ceil(kv + state)


def workspace_bytes(cfg: ModelConfig, dtype: str, quant: QuantConfig | None, tp: int,
                    reserve: MemoryReserve) -> int:
    """Activation workspace of one device: the largest operator's inputs and outputs for
    `reserve.workspace_tokens` tokens (the cost model's activation bytes, split by tp)."""
    if reserve.workspace_tokens == 0:
        return 0
    ops = group_costs(cfg, [(SeqWork(1, 1, 0), 1)], dtype, quant, by_layer=True)
    per_token = max(op.act_bytes / (1 if op.name in REPLICATED_OPS else tp) for op in ops)
    return math.ceil(per_token * reserve.workspace_tokens)


def logits_bytes_per_seq(cfg: ModelConfig) -> int:
    """The float32 logits row each sequence's sampling holds."""
    return 4 * cfg.vocab_size
