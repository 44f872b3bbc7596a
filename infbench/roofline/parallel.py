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

With attention data parallelism (`attention_dp` > 1, `device_ops`) a device runs two
batches: the attention side (norms, the mixer's projections and attention, the router, the
shared experts, the replicated embedding) on its rank's 1/attention_dp of the sequences,
split tp / attention_dp ways; the group side (`group_ops`: the dense MLP, the routed
experts, the LM head) on every rank's tokens, split tp ways (the experts: ep = tp).  With
`dense_dp` the dense MLP moves to the attention side.

Collectives, `n` devices, message `S` bytes, link bandwidth `B` per direction and latency
`a` per hop (`Interconnect.tier` picks NVLink / PCIe / network by the group's span):

- all-reduce (ring): 2 (n - 1) / n * S / B + 2 (n - 1) a
- all-gather and all-to-all: (n - 1) / n * S / B + (n - 1) a
- a pipeline hop: S / B + a

The expert-parallel all-to-all of a MoE layer (`all_to_all_plan`) is priced as a lower
bound, as DeepEP's normal mode sends: a token crosses once to each other node (scale-up
domain) holding at least one of its top-k experts and is forwarded inside the node over
the scale-up link to each other device holding one (`expert_destinations`: the expected
counts under uniform routing, hypergeometric, DeepSeek's group limit included); the
combine comes back the same way.  The dispatch values are in the model dtype, or FP8 with
a float32 scale per 128 values; the combine in the model dtype.  The network and the
in-node parts run at once (the slower one counts).  With attention dp a device dispatches
its rank's tokens / (tp / attention_dp), without it every device holds (and sends) the
whole step's tokens.  Under attention dp the dense MLP layers gather every rank's tokens
before (all-gather) and scatter them after (reduce-scatter, priced as an all-gather),
and so does the LM head.

Communication is not overlapped with compute: each collective sits between two
operators that need its result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from infbench.core.config import LayerSpec, ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.core.parallel import FP8_SCALE_GROUP, Disaggregation, ParallelConfig
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
# Under attention dp: the operators that run on every rank's tokens, split over all tp devices
GROUP_OPS = ("mlp", "moe_experts", "lm_head")
Groups = Sequence[tuple[SeqWork, int]]  # a batch as (sequence, how many such sequences)


def kv_share(cfg: ModelConfig, tp: int) -> float:
    """The fraction of the KV cache (reads, writes, bytes held) one of `tp` devices has."""
    if tp == 1:
        return 1.0
    if cfg.attention.kind == "mla":
        return 1.0  # the latent is shared by all heads: every device keeps all of it
    kvh = cfg.kv_heads
    return 1.0 / tp if kvh >= tp else 1.0 / kvh


def group_ops(par: ParallelConfig) -> tuple[str, ...]:
    """The operators that run on every rank's tokens under attention dp (`GROUP_OPS`; the
    dense MLP runs on the rank's own under `dense_dp`)."""
    return tuple(n for n in GROUP_OPS if not (par.dense_dp and n == "mlp"))


def op_split(name: str, par: ParallelConfig) -> int:
    """How many devices share operator `name` (its FLOPs, weights and activations): tp, or
    1 for what every device runs whole; under attention dp the attention side is split over
    a rank's tp / attention_dp devices and the embedding is replicated."""
    if name in REPLICATED_OPS or (par.attention_dp > 1 and name == "embed"):
        return 1
    if par.attention_dp > 1 and name not in group_ops(par):
        return par.attention_tp
    return par.tp


def shard_ops(cfg: ModelConfig, ops: Iterable[OpCost], par: ParallelConfig) -> list[OpCost]:
    """One device's share of each operator of one batch (identity on one device)."""
    ops = list(ops)
    if par.tp == 1:
        return ops
    kv = kv_share(cfg, par.attention_tp)
    out = []
    for op in ops:
        part = 1.0 / op_split(op.name, par)
        out.append(replace(
            op, flops=op.flops * part, weight_bytes=op.weight_bytes * part,
            act_bytes=op.act_bytes * part, state_bytes=op.state_bytes * part,
            kv_read_bytes=op.kv_read_bytes * kv, kv_write_bytes=op.kv_write_bytes * kv))
    return out


def rank_groups(groups: Groups, par: ParallelConfig) -> list[tuple[SeqWork, int]]:
    """The fullest attention rank's share of a batch: ceil(n / attention_dp) of each group."""
    return [(sw, par.rank_batch(n)) for sw, n in groups]


def device_ops(cfg: ModelConfig, groups: Groups, dtype: str, quant: QuantConfig | None,
               par: ParallelConfig, *, stage: str, by_layer: bool = False) -> list[OpCost]:
    """One device's operators for a replica's batch `groups`: the batch's costs split as
    `op_split` says; under attention dp the attention side is priced on the fullest rank's
    sequences and the group side (`group_ops`) on the whole batch."""
    ops = group_costs(cfg, groups, dtype, quant, by_layer=by_layer, stage=stage)
    if par.attention_dp == 1:
        return shard_ops(cfg, ops, par)
    rank = group_costs(cfg, rank_groups(groups, par), dtype, quant, by_layer=by_layer,
                       stage=stage)
    out = []
    for mine, whole in zip(shard_ops(cfg, rank, par), shard_ops(cfg, ops, par), strict=True):
        assert (mine.name, mine.layer) == (whole.name, whole.layer)
        out.append(whole if mine.name in group_ops(par) else mine)
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


@dataclass(frozen=True)
class AllToAll:
    """The expert-parallel all-to-all of one MoE layer on one device in one step, priced as
    a lower bound (DeepEP's normal mode, which SGLang runs): a token crosses to each other
    node that holds at least one of its top-k experts once, over the network, and is
    forwarded inside a node over the scale-up link to each other device holding one; a
    copy for the device itself is free.  The combine returns the same way, reduced per node
    before it crosses.  `copies_bytes` is the upper bound every top-k copy would send."""

    group: int  # devices (ranks of tp / ep devices) the experts are spread over (ep)
    tier: str  # the link between nodes (the group's slowest), Interconnect.tier
    link_tier: str  # the link inside a node (= tier when the group fits one node)
    nodes: int  # scale-up domains the group spans
    moe_layers: int  # MoE layers of the replica (each pays one dispatch and one combine)
    tokens: float  # tokens this device dispatches
    top_k: int
    remote_nodes: float  # expected other nodes one token is sent to (uniform routing)
    link_sends: float  # expected devices inside the nodes a token is forwarded to
    dispatch_bytes: float  # bytes this device's dispatch sends: over the network + link
    combine_bytes: float  # and the combine (model dtype)
    network_bytes: float  # of those (dispatch + combine), over the network
    copies_bytes: float  # the dispatch if every top-k copy were sent: tokens x k x hidden
    dispatch_dtype: str  # the dispatch's values: the model dtype or float8
    time_s: float  # one layer: dispatch + combine (+ the slice all-reduce when tp > ep)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dispatch_value_bytes(par: ParallelConfig, dtype: str) -> float:
    """Bytes per dispatched value: the model dtype's, or FP8 with a float32 scale per 128."""
    if par.dispatch_dtype == "float8":
        return 1.0 + 4.0 / FP8_SCALE_GROUP
    return float(dtype_bytes(dtype))


def expert_destinations(cfg: ModelConfig, par: ParallelConfig, hw: HardwareSpec
                        ) -> tuple[int, float, float]:
    """(nodes, remote nodes, forwards inside nodes) one token's dispatch reaches under
    uniform routing, experts spread evenly and in order over the ep ranks and the nodes.

    A node is the scale-up domain (NVLink; the host where there is none) the tp span is cut
    into; each of the `nodes` holds E / nodes experts and is touched with probability
    q_node (`MoEConfig.touch_probability`), so a token crosses to (nodes - 1) q_node other
    nodes.  Each of the ep ranks (E / ep experts) is touched with q_rank; inside every node
    the copy arrives at one rank (the sender, or its peer that received it over the
    network) and goes on to the others it touches: (ep - nodes) q_rank forwards.  A group
    that does not split evenly over its nodes is priced rank by rank over the slowest tier
    ((ep - 1) q_rank remote sends, no forwards)."""
    moe = cfg.moe
    assert moe is not None and hw.interconnect is not None
    net = hw.interconnect
    domain = net.link_domain if net.link_domain > 1 else net.devices_per_node
    q_rank = moe.touch_probability(moe.num_experts // par.ep)
    nodes = -(-par.tp // domain)
    if nodes == 1:
        return 1, 0.0, (par.ep - 1) * q_rank
    if par.tp % domain or par.ep % nodes or moe.num_experts % nodes:
        return nodes, (par.ep - 1) * q_rank, 0.0
    q_node = moe.touch_probability(moe.num_experts // nodes)
    return nodes, (nodes - 1) * q_node, (par.ep - nodes) * q_rank


def all_to_all_plan(cfg: ModelConfig, par: ParallelConfig, hw: HardwareSpec, dtype: str,
                    groups: Groups) -> AllToAll | None:
    """What one MoE layer's dispatch and combine move on one device for the replica's batch
    `groups` (None without expert parallelism): `expert_destinations` copies of each token
    (not top-k), the network part and the in-node part running at once (the time is the
    slower of the two, one hop's latency each way)."""
    moe = cfg.moe
    if par.ep == 1 or moe is None or not has_mlp(cfg):
        return None
    if hw.interconnect is None:
        _link(hw, par.ep, par.tp)  # the one-line refusal
    assert hw.interconnect is not None
    num_tokens = sum(sw.query_len * n for sw, n in groups)
    if par.attention_dp > 1:  # a rank's tokens, split between its devices
        tokens = sum(sw.query_len * n for sw, n in rank_groups(groups, par)) / par.attention_tp
    else:  # tensor-parallel attention: every device holds the whole step's tokens
        tokens = float(num_tokens)
    nodes, remote, forwards = expert_destinations(cfg, par, hw)
    row = tokens * cfg.hidden_size  # values of one copy of the device's tokens
    a, v = dtype_bytes(dtype), dispatch_value_bytes(par, dtype)
    tier, net_bw, net_lat = hw.interconnect.tier(par.ep, par.tp)
    inside = min(par.tp, par.tp // nodes)
    link_tier, link_bw, link_lat = hw.interconnect.tier(inside, inside)
    time = 0.0
    for value in (v, a):  # the dispatch, then the combine
        over_net = row * remote * value
        over_link = row * forwards * value
        time += max(over_net / net_bw + (net_lat if over_net else 0.0),
                    over_link / link_bw + (link_lat if over_link else 0.0))
    if par.tp > par.ep:  # each expert is sliced over tp / ep devices
        time += all_reduce_s(row * moe.num_experts_per_tok * a / par.ep, par.tp // par.ep, hw,
                             span=par.tp)
    moe_layers = sum(1 for spec in cfg.layers() if is_moe_layer(cfg, spec))
    sends = remote + forwards
    return AllToAll(par.ep, tier, link_tier, nodes, moe_layers, tokens, moe.num_experts_per_tok,
                    remote, forwards, row * sends * v, row * sends * a, row * remote * (v + a),
                    row * moe.num_experts_per_tok * v,
                    par.dispatch_dtype if par.dispatch_dtype != "model" else dtype, time)


def stage_comm(cfg: ModelConfig, par: ParallelConfig, hw: HardwareSpec, dtype: str,
               specs: Sequence[LayerSpec], groups: Groups, first: bool, last: bool
               ) -> CommTime:
    """The collectives of one pipeline stage's forward over the replica's batch `groups`."""
    if par.tp == 1:
        return CommTime()
    if par.attention_dp > 1:
        return _dp_attention_comm(cfg, par, hw, dtype, specs, groups, last)
    tp = par.tp
    a = dtype_bytes(dtype)
    num_tokens = sum(sw.query_len * n for sw, n in groups)
    num_logits = sum(sw.num_logits * n for sw, n in groups)
    one_reduce = all_reduce_s(num_tokens * cfg.hidden_size * a, tp, hw)
    plan = all_to_all_plan(cfg, par, hw, dtype, groups)
    reduces = 1 if first else 0  # the vocabulary-parallel embedding's partial rows
    to_all = 0.0
    for spec in specs:
        reduces += 1  # after the mixer's output projection
        if not has_mlp(cfg):
            continue
        if plan is not None and is_moe_layer(cfg, spec):
            to_all += plan.time_s  # dispatch + combine replace the MLP's all-reduce
        else:
            reduces += 1  # after the MLP's down projection
    gather = all_gather_s(num_logits * cfg.vocab_size * a, tp, hw) if last else 0.0
    return CommTime(all_reduce_s=reduces * one_reduce, all_gather_s=gather, all_to_all_s=to_all)


def _dp_attention_comm(cfg: ModelConfig, par: ParallelConfig, hw: HardwareSpec, dtype: str,
                       specs: Sequence[LayerSpec], groups: Groups, last: bool) -> CommTime:
    """A stage's collectives under attention dp: the attention output all-reduced within a
    rank (tp / attention_dp devices; none when a rank is one device), the MoE layers'
    all-to-all over all tp devices (and a rank all-reduce joining the shared experts'
    partial sums with the routed outputs), the dense MLP layers' all-gather of every rank's
    tokens and reduce-scatter back (`dense_dp`: a rank all-reduce), and the LM head's
    gather of the hidden states and of the logits.  The embedding is replicated: no collective."""
    a, d = dtype_bytes(dtype), cfg.hidden_size
    total = sum(sw.query_len * n for sw, n in groups)
    rank = sum(sw.query_len * n for sw, n in rank_groups(groups, par))
    logits = sum(sw.num_logits * n for sw, n in groups)
    rank_reduce = all_reduce_s(rank * d * a, par.attention_tp, hw, span=par.attention_tp)
    dense_gather = all_gather_s(total * d * a, par.tp, hw)
    plan = all_to_all_plan(cfg, par, hw, dtype, groups)
    assert plan is not None  # check_model: attention dp needs routed experts, ep = tp
    reduces, gathers, to_all = 0, 0.0, 0.0
    for spec in specs:
        reduces += 1  # the attention output, within the rank
        if is_moe_layer(cfg, spec):
            to_all += plan.time_s
            reduces += 1
        elif par.dense_dp:
            reduces += 1  # the rank's own tokens, after the dense MLP's down projection
        else:
            gathers += 2 * dense_gather  # all-gather before the dense MLP, reduce-scatter after
    if last:
        gathers += all_gather_s(logits * d * a, par.tp, hw) + \
            all_gather_s(logits * cfg.vocab_size * a, par.tp, hw)
    return CommTime(all_reduce_s=reduces * rank_reduce, all_gather_s=gathers,
                    all_to_all_s=to_all)


# ------------------------------------------------------------------ disaggregation
@dataclass(frozen=True)
class KVTransfer:
    """The prompts' KV cache crossing from a prefill instance to a decode instance."""

    bytes: float  # batch x prompt tokens x KV bytes per token (+ constant state)
    tier: str  # the link between the instances: the scale-up link when both fit one domain
    links: int  # device pairs sending at once: min(prefill, decode) devices of an instance
    time_s: float  # bytes / links over the tier, plus one hop's latency


@dataclass(frozen=True)
class PoolPrice:
    """One pool of a disaggregated deployment: its devices, the time one instance takes for
    a batch (prefill: the prompts; decode: the gen_len - 1 decode steps), the requests per
    second the pool sustains and its memory per device."""

    instances: int
    devices: int  # instances x devices per instance
    batch_time_s: float
    requests_per_s: float  # instances x batch / batch_time (0: the pool has no work)
    memory_bytes: int  # per device
    fits: bool
    max_batch: int


@dataclass(frozen=True)
class Disaggregated:
    """What `parallel.disaggregated` adds to a prediction: the pools and the transfer; the
    throughput is the slower pool's, over the devices of both."""

    prefill: PoolPrice
    decode: PoolPrice
    transfer: KVTransfer

    @property
    def requests_per_s(self) -> float:
        rates = [r for r in (self.prefill.requests_per_s, self.decode.requests_per_s) if r]
        return min(rates)

    @property
    def bound(self) -> str:
        """The pool that sets the throughput."""
        d = self.decode.requests_per_s
        return "decode" if d and d < self.prefill.requests_per_s else "prefill"

    @property
    def devices(self) -> int:
        return self.prefill.devices + self.decode.devices

    def wall_s(self, first_e2e_s: float, waves: int, batch: int) -> float:
        """W waves of `batch` requests pipelined through the pools: the first one's E2E, then
        one more wave every batch / (the slower pool's requests per second)."""
        return first_e2e_s + (waves - 1) * batch / self.requests_per_s

    def to_dict(self, gen_len: int) -> dict[str, Any]:
        out = self.requests_per_s * gen_len
        return {**asdict(self), "bound": self.bound, "devices": self.devices,
                "requests_per_s": self.requests_per_s, "output_tokens_per_s": out,
                "output_tokens_per_s_per_device": out / self.devices}


def kv_transfer(kv_bytes: float, pools: Disaggregation, hw: HardwareSpec) -> KVTransfer:
    """`kv_bytes` (the batch's prompt cache) from a prefill to a decode instance: every
    device of the smaller instance sends or takes its share at once, over the scale-up link
    when both instances fit one domain (an HGX board, a GB200 NVL72 rack), else the tier
    their joint span reaches (PCIe in a node, the network)."""
    p, d = pools.prefill.devices_per_replica, pools.decode.devices_per_replica
    links = min(p, d)
    if hw.interconnect is None:
        raise ConfigError(f"hardware {hw.name!r} has no interconnect figures (a calibrated "
                          "profile describes one device); disaggregation needs a table entry")
    tier = hw.interconnect.tier(2, p + d)[0]
    return KVTransfer(kv_bytes, tier, links, hop_s(kv_bytes / links, p + d, hw))


# ------------------------------------------------------------------ memory per device
def stage_weight_bytes(cfg: ModelConfig, dtype: str, quant: QuantConfig | None,
                       par: ParallelConfig, specs: Sequence[LayerSpec], first: bool,
                       last: bool) -> int:
    """Weights one device of a stage holds: each tensor / its `op_split` (the replicated
    ones whole; under attention dp the attention side / (tp / attention_dp), the experts,
    dense MLP and head / tp)."""
    q = quant or QuantConfig()
    a = dtype_bytes(dtype)
    ws = [w for spec in specs for w in layer_weights(cfg, spec)]
    top = model_weights(cfg, q)
    tied_head = len(top) == 2  # embed + final norm: the tied embedding is the head
    for w in top:
        if (w.op == "embed" and (first or (last and tied_head))) or \
                (w.op != "embed" and last):
            ws.append(w)
    return math.ceil(sum(w.nbytes(q, a) / op_split(w.op, par) for w in ws))


def stage_kv_bytes_per_seq(cfg: ModelConfig, dtype: str, quant: QuantConfig | None, tp: int,
                           specs: Sequence[LayerSpec], context_len: int) -> int:
    """KV + constant state of one sequence on one of the `tp` devices its attention is split
    over (under attention dp: a rank's tp / attention_dp)."""
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
