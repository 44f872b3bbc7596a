"""The seconds of one engine step, priced by the analytic cost model for the batch it holds.

The simulation (`sim/engine_sim.py`) asks this module, once per scheduled step, how long a
step of exactly that batch takes: each sequence's new tokens (a prompt chunk, a decode, a
verification of drafts), its context and whether it needs logits.  The answer is the same
roofline `infbench predict` uses for a whole stage (`roofline.costs.group_costs` for the
FLOPs and bytes, `roofline.analysis.step_rates` for the rates, the calibrated profile's
fixed per-step cost `HardwareSpec.step_overhead_s`, the operator overlap of
`default_overlap`), only priced per step instead of as a mean over identical sequences.

A mixed step (chunked prefill beside decodes) prices its matmuls once over all its rows,
at the step's row count (the measured matmul curve), and attention per kind of sequence:
the decodes' attention at the decode kernel's measured KV rate, the prefill chunks' at the
prefill kernel's FLOP/s, as the engine runs them (one paged kernel per kind).

Speed: the simulation prices one step per scheduler iteration, thousands of times, so the
common case is made O(operators) instead of O(sequences x layers).  For a model whose
layers are all softmax attention without windows or chunks, on one device or tensor parallel
(`LinearPricer`), an attention
operator's FLOPs and bytes are exactly linear in (attended pairs, keys read, query tokens)
per sequence, and every other operator's exactly linear in (step tokens, logits rows); the
coefficients are read off `group_costs` at a few small batches, so the step's costs are
the cost model's own numbers (a test checks them against `group_costs` on random batches).
Other models (windows, MLA, linear attention, SSM, MoE routing that depends on the tokens,
attention data parallel) go through `group_costs` / `device_ops` for every step (`ExactPricer`).
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.parallel import SINGLE, ParallelConfig
from infbench.hardware.spec import HardwareSpec
from infbench.roofline.analysis import (
    ATTENTION_OPS,
    Rates,
    check_overlap,
    default_overlap,
    step_rates,
)
from infbench.roofline.costs import SeqWork
from infbench.roofline.layer_costs import attended_pairs
from infbench.roofline.ops import OpCost
from infbench.roofline.parallel import device_ops, stage_comm

# (query tokens, context tokens, logits rows) of one sequence in a step
Work = tuple[int, int, int]


@dataclass(frozen=True)
class StepBatch:
    """One step's batch: prefill rows (prompts, chunks, recomputes) as Work, the plain
    decodes by their contexts (one token and one logits row each), and speculative
    verifications as Work (q = 1 + drafts rows, all with logits, priced as decode work)."""

    prefill: Sequence[Work]
    decode_contexts: Sequence[int]
    verify: Sequence[Work] = ()

    @property
    def num_tokens(self) -> int:
        return (sum(q for q, _, _ in self.prefill) + len(self.decode_contexts)
                + sum(q for q, _, _ in self.verify))

    @property
    def num_seqs(self) -> int:
        return len(self.prefill) + len(self.decode_contexts) + len(self.verify)


class StepPricer(abc.ABC):
    """Seconds of a step of `cfg` on `hw`; `make_pricer` picks the implementation."""

    def __init__(self, cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
                 parallel: ParallelConfig = SINGLE, overlap: str = "auto") -> None:
        check_overlap(overlap)
        self.cfg, self.hw, self.dtype, self.quant, self.parallel = cfg, hw, dtype, quant, parallel
        self.overlap = default_overlap(hw) if overlap == "auto" else overlap
        self._rates: dict[tuple[int, str], Rates] = {}
        # measured / priced step ratio by token count of this model on this profile
        self.scale: Callable[[int], float] | None = None

    def rates(self, num_tokens: int, stage: str) -> Rates:
        key = (num_tokens, stage)
        rates = self._rates.get(key)
        if rates is None:
            rates = self._rates[key] = step_rates(self.cfg, self.hw, self.dtype, num_tokens,
                                                  stage, self.quant)
        return rates

    def overhead_s(self, num_seqs: int) -> float:
        return self.hw.step_overhead_s(self.cfg.num_layers, num_seqs)

    def seconds(self, batch: StepBatch) -> float:
        """The step's duration: the cost model's price (`_price`), times the model's
        calibrated step ratio at the step's token count when one is set (`scale`,
        measure/calibrate_model.py)."""
        price = self._price(batch)
        return price if self.scale is None else price * self.scale(batch.num_tokens)

    @abc.abstractmethod
    def _price(self, batch: StepBatch) -> float:
        """The cost model's price of the step: exact, or its linear fast path."""

    def _time(self, entries: list[tuple[float, float, float, float]]) -> float:
        """Roofline time of (bytes, flops, bytes/s, FLOP/s) entries under the overlap."""
        if self.overlap == "none":
            return sum(max(b / bw, f / peak) for b, f, bw, peak in entries)
        return max(sum(b / bw for b, _, bw, _ in entries),
                   sum(f / peak for _, f, _, peak in entries))


def _rate_of(rates: Rates, name: str) -> tuple[float, float]:
    if rates.attention is not None and name in ATTENTION_OPS:
        return rates.attention
    if name in rates.quantized:
        return rates.bandwidth, rates.quantized[name]
    return rates.bandwidth, rates.peak


class ExactPricer(StepPricer):
    """Every step through the cost model's own per-batch functions (any model, any layout)."""

    def _ops(self, works: list[SeqWork], stage: str) -> list[OpCost]:
        groups = list(Counter(works).items())
        return device_ops(self.cfg, groups, self.dtype, self.quant, self.parallel, stage=stage)

    def _price(self, batch: StepBatch) -> float:
        par, cfg = self.parallel, self.cfg
        num_tokens = batch.num_tokens
        stage = "prefill" if batch.prefill else "decode"
        rates = self.rates(num_tokens, stage)
        prefill = [SeqWork(q, c, n) for q, c, n in batch.prefill]
        decodes = [SeqWork(1, c, 1) for c in batch.decode_contexts]
        decodes += [SeqWork(q, c, n) for q, c, n in batch.verify]
        entries = [(op.bytes, op.flops, *_rate_of(rates, op.name))
                   for op in self._ops(prefill + decodes, stage) if op.name not in ATTENTION_OPS]
        # softmax attention per kind of sequence, at that kind's kernel rates
        for works, kind, kind_rates in ((prefill, stage, rates),
                                        (decodes, "decode", self.rates(num_tokens, "decode"))):
            if works:
                entries += [(op.bytes, op.flops, *_rate_of(kind_rates, op.name))
                            for op in self._ops(works, kind) if op.name in ATTENTION_OPS]
        groups = list(Counter(prefill + decodes).items())
        comm = stage_comm(cfg, par, self.hw, self.dtype, cfg.layers(), groups, True, True)
        return self._time(entries) + comm.total_s + self.overhead_s(batch.num_seqs)


_Vec = tuple[float, float]  # (flops, bytes) of one operator


def _vectors(ops: list[OpCost]) -> dict[str, _Vec]:
    return {op.name: (op.flops, op.bytes) for op in ops}


def _combine(terms: list[tuple[float, dict[str, _Vec]]]) -> dict[str, _Vec]:
    """sum of factor x vectors, per operator name."""
    out: dict[str, list[float]] = {}
    for factor, vecs in terms:
        for name, (f, b) in vecs.items():
            acc = out.setdefault(name, [0.0, 0.0])
            acc[0] += factor * f
            acc[1] += factor * b
    return {name: (f, b) for name, (f, b) in out.items()}


class LinearPricer(StepPricer):
    """Plain softmax attention (one device or tp): the step's costs from linear coefficients.

    Attention operators: per sequence P x pairs + K x keys + Q x query tokens.  The rest
    (projections, MLP, norms, embedding, LM head): W + T x tokens + L x logits rows.
    Both are exact for this family (module docstring), read off `group_costs` here."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

        def costs(*works: tuple[int, int, int]) -> tuple[dict[str, _Vec], dict[str, _Vec]]:
            groups = [(SeqWork(q, c, n), 1) for q, c, n in works]
            vecs = _vectors(device_ops(self.cfg, groups, self.dtype, self.quant, self.parallel,
                                       stage="step"))
            attn = {k: v for k, v in vecs.items() if k in ATTENTION_OPS}
            rest = {k: v for k, v in vecs.items() if k not in ATTENTION_OPS}
            return attn, rest

        # attention: (q, c) = (1, 1): pairs 1 keys 1; (1, 2): 2, 2; (2, 2): 3, 2
        a11, r11 = costs((1, 1, 1))
        a12, _ = costs((1, 2, 1))
        a22, r22 = costs((2, 2, 1))
        s, a, b = a11, _combine([(1, a12), (-1, a11)]), _combine([(1, a22), (-1, a12)])
        p = _combine([(1, a), (1, b), (-1, s)])
        self._attn_p, self._attn_k = p, _combine([(1, a), (-1, p)])
        self._attn_q = _combine([(1, b), (-1, p)])
        # the rest: tokens t, logits l: (1, 1), (2, 1), (2, 2)
        _, r22b = costs((1, 1, 1), (1, 1, 1))
        t_coef = _combine([(1, r22), (-1, r11)])  # (2, 1) - (1, 1)
        l_coef = _combine([(1, r22b), (-1, r22)])  # (2, 2) - (2, 1)
        self._rest_t, self._rest_l = t_coef, l_coef
        self._rest_w = _combine([(1, r11), (-1, t_coef), (-1, l_coef)])
        self._names = list(self._rest_w)
        self._comm: dict[tuple[int, int], float] = {}

    @staticmethod
    def supports(cfg: ModelConfig, parallel: ParallelConfig) -> bool:
        # tensor parallel shards each operator by a fixed factor (roofline.parallel.shard_ops)
        # and its collectives depend on the step's tokens and logits rows only
        return (parallel.pp == 1 and parallel.attention_dp == 1
                and parallel.disaggregated is None and cfg.moe is None
                and all(spec.mixer == "attention" and spec.window is None and spec.chunk is None
                        for spec in cfg.layers()))

    def _attention(self, pairs: float, keys: float, queries: float) -> dict[str, _Vec]:
        out = {}
        for name, (pf, pb) in self._attn_p.items():
            kf, kb = self._attn_k[name]
            qf, qb = self._attn_q[name]
            out[name] = (pf * pairs + kf * keys + qf * queries,
                         pb * pairs + kb * keys + qb * queries)
        return out

    def _price(self, batch: StepBatch) -> float:
        prefill, contexts, verify = batch.prefill, batch.decode_contexts, batch.verify
        num_decode = len(contexts)
        num_tokens = num_decode + sum(q for q, _, _ in prefill) + sum(q for q, _, _ in verify)
        num_logits = num_decode + sum(n for _, _, n in prefill) + sum(n for _, _, n in verify)
        stage = "prefill" if prefill else "decode"
        rates = self.rates(num_tokens, stage)
        entries = []
        w, t, lg = self._rest_w, self._rest_t, self._rest_l
        for name in self._names:
            if name == "lm_head" and not num_logits:  # no row needs logits: no head at all
                continue
            (wf, wb), (tf, tb), (lf, lb) = w[name], t[name], lg[name]
            bw, peak = _rate_of(rates, name)
            entries.append((wb + tb * num_tokens + lb * num_logits,
                            wf + tf * num_tokens + lf * num_logits, bw, peak))
        if num_decode or verify:
            keys = float(sum(contexts))  # q = 1: pairs = keys = context
            pairs, queries = keys, float(num_decode)
            for q, c, _ in verify:
                pairs += attended_pairs(c, q, None)
                keys += c
                queries += q
            drates = self.rates(num_tokens, "decode")
            for name, (f, b) in self._attention(pairs, keys, queries).items():
                bw, peak = _rate_of(drates, name)
                entries.append((b, f, bw, peak))
        if prefill:
            pairs = keys = queries = 0.0
            for q, c, _ in prefill:
                pairs += attended_pairs(c, q, None)
                keys += c
                queries += q
            for name, (f, b) in self._attention(pairs, keys, queries).items():
                bw, peak = _rate_of(rates, name)
                entries.append((b, f, bw, peak))
        return self._time(entries) + self._comm_s(num_tokens, num_logits) + \
            self.overhead_s(batch.num_seqs)

    def _comm_s(self, num_tokens: int, num_logits: int) -> float:
        if self.parallel.tp == 1:
            return 0.0
        key = (num_tokens, num_logits)
        if key not in self._comm:
            groups = [(SeqWork(1, 1, 1), num_logits)]
            if num_tokens > num_logits:
                groups.append((SeqWork(num_tokens - num_logits, num_tokens - num_logits, 0), 1))
            cfg = self.cfg
            self._comm[key] = stage_comm(cfg, self.parallel, self.hw, self.dtype, cfg.layers(),
                                         groups, True, True).total_s
        return self._comm[key]


def make_pricer(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
                parallel: ParallelConfig = SINGLE, overlap: str = "auto") -> StepPricer:
    """The fast linear pricer where it is exact, the per-step cost model elsewhere."""
    cls = LinearPricer if LinearPricer.supports(cfg, parallel) else ExactPricer
    return cls(cfg, hw, dtype, quant, parallel, overlap)
