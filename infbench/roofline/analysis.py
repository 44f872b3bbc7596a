"""Roofline predictions: stage times, TTFT, time per token, throughput, memory, max batch.

A step's time is max(bytes / bandwidth, FLOPs / peak(dtype)) over the whole step
(`overlap="full"`, the lecture's model: one roofline per step, every operator's memory
traffic hidden under the others' compute), or the sum of each operator's own roofline
(`overlap="none"`: operators run one after another, a memory-bound one cannot hide under a
compute-bound one).  `overlap="auto"` (the default) is none on a profile calibrated through
the engine and full on datasheet entries (`default_overlap`).  On such a profile the
matmuls run at the measured rate for the step's rows (`HardwareSpec.peak_at`) and softmax
attention at the measured rates of the engine's decode and prefill kernels (`Rates`).  Each
operator also gets its own roofline time for the per-op table and plot.  Parallel
predictions (`ParallelConfig`, `roofline.parallel`) price one device's share and add the
collectives.

- Prefill: all `batch` prompts in one step.  TTFT is that step's time: the first
  output token is sampled from the prefill logits.
- Decode: generated token i (1..gen_len) is fed back in a step whose context is
  prompt_len + i tokens (the KV cache holds prompt_len + gen_len at the end).  The
  reported step is the exact mean over those gen_len steps: FLOPs and bytes are
  piecewise affine in the context (breaks only where a sliding window fills), so
  each affine piece is summed in closed form from its two end points, and the
  max() in the step time is split where memory and compute time cross.
- E2E = TTFT + (gen_len - 1) * time per token (TPOT as in ARCHITECTURE.md).
- Memory = weights + KV cache at prompt_len + gen_len + constant state, per device.  It
  fits when it plus the activation workspace and each sequence's float32 logits stay
  within the usable capacity: the reported capacity x `MemoryReserve.utilization`.
- gen_len 1: the only output token comes from the prefill: no decode step, no TPOT.
- Speculative decoding (Leviathan et al.): g draft tokens accepted with rate a give
  (1 - a^(g+1)) / (1 - a) tokens per step; a step costs g * c * T_decode (the draft
  at cost ratio c) + T_verify (the target over g+1 tokens), both averaged over the
  same contexts as plain decode.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, get_args

from infbench.core.config import (
    MAX_BATCH,
    MAX_TOKENS,
    ModelConfig,
    QuantConfig,
    check_count,
)
from infbench.core.errors import ConfigError, UserError
from infbench.core.formats import FP4_WEIGHTS, QUANTIZED_WEIGHTS
from infbench.core.parallel import SINGLE, ParallelConfig
from infbench.core.speculative import SpeculativeConfig
from infbench.hardware.spec import (
    ATTENTION_KEY,
    CURVE_KEY,
    PREFILL_ATTENTION_KEY,
    HardwareSpec,
    MemoryReserve,
)
from infbench.roofline.costs import (
    OpCost,
    ParamCount,
    SeqWork,
    kv_bytes_per_token,
    kv_cache_bytes,
    param_count,
    state_bytes_per_seq,
    total,
    weight_bytes,
)
from infbench.roofline.layer_costs import FIELDS
from infbench.roofline.parallel import (
    AllToAll,
    CommTime,
    Disaggregated,
    PoolPrice,
    all_to_all_plan,
    device_ops,
    hop_s,
    kv_transfer,
    logits_bytes_per_seq,
    stage_comm,
    stage_kv_bytes_per_seq,
    stage_weight_bytes,
    workspace_bytes,
)
from infbench.roofline.shapes import Weight, dtype_bytes, layer_weights, mtp_model

OverlapMode = Literal["full", "none"]  # how a step's operators share the roofline (module doc)
OVERLAP_MODES: tuple[str, ...] = get_args(OverlapMode)
OVERLAP_CHOICES = ("auto", *OVERLAP_MODES)  # auto: `default_overlap(hw)`
DEFAULT_RESERVE = MemoryReserve()



ATTENTION_OPS = ("attn_score", "attn_value")  # softmax attention's passes over the KV cache


@dataclass(frozen=True)
class Rates:
    """The rates a step's operators run at: bytes/s and FLOP/s for the matmuls and the rest
    (the bandwidth and the matmul rate at the step's rows), and, on a profile that measured
    the engine's attention kernels, softmax attention's own (bytes/s, FLOP/s): decode reads
    KV at the measured rate of the paged decode kernel and computes at the dtype's peak,
    prefill reads at the bandwidth and computes at the prefill kernel's measured FLOP/s."""

    bandwidth: float
    peak: float
    attention: tuple[float, float] | None = None  # None: attention priced like the rest
    # operator name -> FLOP/s of the engine's quantized projections at the step's rows
    quantized: dict[str, float] = field(default_factory=dict)

    def of(self, op: OpCost) -> tuple[float, float]:
        """(bytes/s, FLOP/s) of one operator."""
        if self.attention is not None and op.name in ATTENTION_OPS:
            return self.attention
        if op.name in self.quantized:
            return self.bandwidth, self.quantized[op.name]
        return self.bandwidth, self.peak

    def op_times(self, op: OpCost) -> tuple[float, float]:
        """(memory, compute) seconds of one operator."""
        bw, peak = self.of(op)
        return op.bytes / bw, op.flops / peak

    def times(self, ops: Sequence[OpCost]) -> tuple[float, float]:
        """(memory, compute) seconds of the operators together (each at its own rates)."""
        if self.attention is None and not self.quantized:  # one rate: the plain sums
            step = total(ops)
            return step.bytes / self.bandwidth, step.flops / self.peak
        memory = compute = 0.0
        for op in ops:
            op_memory, op_compute = self.op_times(op)
            memory += op_memory
            compute += op_compute
        return memory, compute

    def bound(self, ops: Sequence[OpCost]) -> str:
        memory, compute = self.times(ops)
        return "compute" if compute > memory else "memory"


def quantized_rates(cfg: ModelConfig, hw: HardwareSpec, quant: QuantConfig | None,
                    num_tokens: int | None) -> dict[str, float]:
    """Operator -> FLOP/s for the projections a profile's quantized-kernel curve prices
    (`HardwareSpec.quant_rate`): int8 / int4 weights with float activations (the C++
    dequantize-in-GEMV), in a dense model, at rows within the curve.  Native GGUF formats,
    int8 activations (VNNI kernels), LLM.int8() and MoE experts run other kernels and keep
    the float curve."""
    if (quant is None or num_tokens is None or cfg.moe is not None
            or quant.activations != "float" or quant.method == "llm_int8"):
        return {}
    out: dict[str, float] = {}
    if quant.weights in QUANTIZED_WEIGHTS:
        rate = hw.quant_rate(quant.weights, num_tokens)
        if rate is not None:
            out = {w.op: rate for spec in cfg.layers() for w in layer_weights(cfg, spec)
                   if w.quantized}
    if quant.head == "int8":
        rate = hw.quant_rate("int8", num_tokens)
        if rate is not None:
            out["lm_head"] = rate
    return out


# quant.activations -> the hardware peak key its projections run at, and the weights it needs
LOW_PRECISION_PEAKS = {"fp8": ("float8", ("fp8",)), "fp4": ("float4", FP4_WEIGHTS)}


def low_precision_rates(cfg: ModelConfig, hw: HardwareSpec, quant: QuantConfig | None,
                        base: float) -> dict[str, float]:
    """Operator -> FLOP/s for W8A8 / W4A4 (`quant.activations` fp8 / fp4): the projections
    stored in fp8 (mxfp4 / nvfp4) multiply at the hardware's `float8` (`float4`) peak, in
    prefill and decode alike.  Under native weights an operator the checkpoint keeps in the
    model dtype stays at `base` (the model dtype's matmul rate), and one stored so in only
    some layers (a share s of its rows; one shape per operator, so of its FLOPs too) runs at
    1 / (s / peak + (1 - s) / base): its time summed over the layers, exactly.  Weight-only
    formats (float activations) keep the model dtype's peak: the weights are dequantized into
    the matmul.  A hardware entry without the peak is refused in one line."""
    if quant is None or quant.activations not in LOW_PRECISION_PEAKS:
        return {}
    key, needs = LOW_PRECISION_PEAKS[quant.activations]
    if key not in hw.peak_flops:
        raise UserError(f"hardware {hw.name!r} has no {key!r} peak, which "
                        f"quant.activations={quant.activations} runs the projections at; it "
                        f"has: {', '.join(hw.peak_flops)}; allowed here: quant.activations "
                        "float (weight-only, at the model dtype's peak)")
    peak = hw.peak_flops[key]
    ops = {w.op for spec in cfg.layers() for w in layer_weights(cfg, spec) if w.quantized}
    if quant.weights != "native":
        return dict.fromkeys(sorted(ops), peak)
    rows: dict[str, list[float]] = {}  # op -> [rows in the format, all rows]
    for op, fmt, n in quant.native_mix:
        counts = rows.setdefault(op, [0.0, 0.0])
        counts[0] += n if fmt.split("/")[0] in needs else 0
        counts[1] += n
    rates = {}
    for op in sorted(ops & set(rows)):
        share = rows[op][0] / rows[op][1]
        if share:
            rates[op] = peak if share == 1 else 1.0 / (share / peak + (1 - share) / base)
    return rates


def step_rates(cfg: ModelConfig, hw: HardwareSpec, dtype: str, num_tokens: int | None,
               stage: str = "decode", quant: QuantConfig | None = None) -> Rates:
    """The rates of a step of `num_tokens` rows.  The measured attention rates apply to
    softmax attention (the engine's paged kernels): the decode kernel's KV read rate to
    decode and verify steps, the prefill kernel's FLOP/s to prefill; MLA runs other
    kernels and keeps the bandwidth and the matmul rate.  Quantized projections of decode
    and verify steps run at the profile's quantized-kernel curve (`quantized_rates`); W8A8 /
    W4A4 projections at the float8 / float4 peak in every stage (`low_precision_rates`)."""
    low = low_precision_rates(cfg, hw, quant, hw.peak_at(dtype, num_tokens))
    if stage == "prefill":  # the engine dequantizes and runs the float GEMM there
        rates = Rates(hw.bandwidth, hw.peak_at(dtype, num_tokens), quantized=low)
        measured = hw.prefill_attention_flops
        attention = None if measured is None else (hw.bandwidth, measured)
    else:
        rates = Rates(hw.bandwidth, hw.peak_at(dtype, num_tokens),
                      quantized={**quantized_rates(cfg, hw, quant, num_tokens), **low})
        measured = hw.attention_bandwidth
        attention = None if measured is None else (measured, hw.peak(dtype))
    if attention is None:
        return rates
    mixers = {spec.mixer for spec in cfg.layers()}
    if "attention" not in mixers or "mla" in mixers:
        return rates
    return replace(rates, attention=attention)


def roofline_time(flops: float, nbytes: float, hw: HardwareSpec, dtype: str,
                  num_tokens: int | None = None) -> float:
    """max(bytes / bandwidth, FLOPs / peak); a calibrated profile's peak depends on the
    step's token count (`HardwareSpec.peak_at`), a datasheet's does not."""
    return max(nbytes / hw.bandwidth, flops / hw.peak_at(dtype, num_tokens))


def bound_of(flops: float, nbytes: float, hw: HardwareSpec, dtype: str,
             num_tokens: int | None = None) -> str:
    compute = flops / hw.peak_at(dtype, num_tokens)
    return "compute" if compute > nbytes / hw.bandwidth else "memory"


def step_time(costs: Sequence[OpCost], hw: HardwareSpec, dtype: str,
              num_tokens: int | None = None, num_layers: int = 0, num_seqs: int = 1) -> float:
    """Roofline time of one step: its summed bytes at bandwidth or FLOPs at peak, plus the
    profile's fixed per-step cost (zero for datasheet hardware)."""
    step = total(costs)
    return (roofline_time(step.flops, step.bytes, hw, dtype, num_tokens)
            + hw.step_overhead_s(num_layers, num_seqs))


@dataclass(frozen=True)
class OpTime:
    """An operator of one stage with its roofline time (decode: means over the steps)."""

    cost: OpCost
    time_s: float
    bound: str

    def to_dict(self) -> dict[str, Any]:
        d = self.cost.to_dict()
        del d["layer"]
        return {**d, "time_s": self.time_s, "bound": self.bound}


@dataclass(frozen=True)
class StagePrediction:
    """One stage: `cost` holds FLOPs/bytes of one step (decode: the mean step)."""

    stage: str  # prefill | decode
    cost: OpCost
    time_s: float  # step time (decode: mean step time)
    bound: str  # memory | compute
    ops: tuple[OpTime, ...] = field(default=())

    @property
    def flops(self) -> float:
        return self.cost.flops

    @property
    def bytes(self) -> float:
        return self.cost.bytes

    @property
    def intensity(self) -> float:
        return self.cost.intensity


@dataclass(frozen=True)
class SpecPrediction:
    config: SpeculativeConfig
    expected_tokens_per_step: float
    draft_time_s: float
    verify_time_s: float
    step_time_s: float
    time_per_token_s: float
    speedup: float  # plain decode time per token / speculative time per token


@dataclass(frozen=True)
class Prediction:
    model: str
    hardware: str
    dtype: str
    quant: QuantConfig
    batch: int
    prompt_len: int
    gen_len: int
    params: ParamCount
    weight_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int  # at prompt_len + gen_len, whole batch
    state_bytes: int  # constant state, whole batch
    memory_bytes: int
    memory_capacity_bytes: float
    fits: bool
    max_batch: int
    prefill: StagePrediction
    decode: StagePrediction
    ttft_s: float
    time_per_token_s: float  # speculative when `speculative` is set
    tokens_per_s: float
    e2e_s: float
    speculative: SpecPrediction | None = None
    parallel: ParallelConfig = SINGLE
    overlap: str = "full"
    usable_memory_bytes: float = 0.0  # capacity x utilization, per device
    workspace_bytes: int = 0  # activation workspace + the batch's logits, per device
    prefill_comm: CommTime = CommTime()
    decode_comm: CommTime = CommTime()  # one decode round (pp: all micro-batches)
    pipeline_bubble: float = 0.0  # decode: fraction of a round a device idles (pp > 1)
    prefill_all_to_all: AllToAll | None = None  # expert parallel: one MoE layer's, per device
    decode_all_to_all: AllToAll | None = None  # (pp > 1: one micro-batch's)
    disaggregated: Disaggregated | None = None  # the pools and the KV transfer between them

    @property
    def decode_steps(self) -> int:
        """Decode steps a request runs: the first output token comes from the prefill."""
        return self.gen_len - 1

    def to_dict(self) -> dict[str, Any]:
        return prediction_dict(self)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory at one batch: the fullest pipeline stage's."""

    weight_bytes: int
    kv_cache_bytes: int  # KV of the whole batch on this device
    state_bytes: int
    workspace_bytes: int  # activation workspace + the batch's float32 logits
    usable_bytes: float

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes + self.state_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes + self.workspace_bytes <= self.usable_bytes


def _stage_memory(cfg: ModelConfig, dtype: str, quant: QuantConfig | None,
                  par: ParallelConfig, context_len: int) -> list[tuple[int, int, int]]:
    """(weights, KV per sequence, state per sequence) of one device of each stage; under
    attention dp a device holds the sequences of its rank only (`ParallelConfig.rank_batch`)."""
    if par.disaggregated is not None:
        raise ConfigError("parallel.disaggregated: each pool has its own memory per device; "
                          "`infbench predict` prices the pools (their memory and max batch)")
    if par.tp == 1 and par.pp == 1:  # the single-device functions, to the byte
        return [(weight_bytes(cfg, dtype, quant), kv_cache_bytes(cfg, dtype, quant, context_len, 1),
                 state_bytes_per_seq(cfg, dtype))]
    specs = cfg.layers()
    stages = par.stage_layers(cfg.num_layers)
    at = par.attention_tp
    out = []
    for i, layers in enumerate(stages):
        mine = [specs[j] for j in layers]
        w = stage_weight_bytes(cfg, dtype, quant, par, mine, i == 0, i == len(stages) - 1)
        kv_state = stage_kv_bytes_per_seq(cfg, dtype, quant, at, mine, context_len)
        state = stage_kv_bytes_per_seq(cfg, dtype, quant, at, mine, 0)  # no tokens held
        out.append((w, kv_state - state, state))
    return out


def device_memory(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig | None,
                  context_len: int, batch: int, parallel: ParallelConfig = SINGLE,
                  reserve: MemoryReserve = DEFAULT_RESERVE) -> DeviceMemory:
    """Memory of the fullest device at `batch` sequences (per replica) of `context_len`
    tokens; the logits are gathered for the whole batch on every device."""
    work = workspace_bytes(cfg, dtype, quant, parallel.attention_tp, reserve)
    logits = logits_bytes_per_seq(cfg) if reserve.workspace_tokens else 0
    usable = hw.memory_bytes * reserve.utilization
    held = parallel.rank_batch(batch)
    best: DeviceMemory | None = None
    for w, kv, state in _stage_memory(cfg, dtype, quant, parallel, context_len):
        m = DeviceMemory(w, kv * held, state * held, work + logits * batch, usable)
        if best is None or m.memory_bytes + m.workspace_bytes > \
                best.memory_bytes + best.workspace_bytes:
            best = m
    assert best is not None
    return best


def max_batch(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig | None,
              context_len: int, parallel: ParallelConfig = SINGLE,
              reserve: MemoryReserve = DEFAULT_RESERVE) -> int:
    """Largest batch (per replica) whose weights + KV (at `context_len`) + state + workspace
    fit every device's usable memory; 0 if the weights do not.  Under attention dp each
    device holds the KV of ceil(batch / attention_dp) sequences."""
    work = workspace_bytes(cfg, dtype, quant, parallel.attention_tp, reserve)
    logits = logits_bytes_per_seq(cfg) if reserve.workspace_tokens else 0
    usable = hw.memory_bytes * reserve.utilization
    dp = parallel.attention_dp
    best: int | None = None
    for w, kv, state in _stage_memory(cfg, dtype, quant, parallel, context_len):
        free = usable - w - work
        if free < 0:
            return 0
        if kv + state <= 0:
            raise ConfigError(f"model {cfg.name!r} keeps no per-sequence state: no batch limit")
        fit = int(free // ((kv + state) / dp + logits))  # an upper bound: ceil() holds more
        while fit > 0 and parallel.rank_batch(fit) * (kv + state) + fit * logits > free:
            fit -= 1
        best = fit if best is None else min(best, fit)
    assert best is not None
    return best


def check_context(cfg: ModelConfig, prompt_len: int, gen_len: int) -> None:
    """prompt + generated tokens within the model's maximum context (`max_seq_len`).

    The commands (`predict`, `kv`, `roofline`) call it before `predict`; `predict` itself
    prices any context (a measured run's prediction follows what the engine accepted)."""
    if prompt_len + gen_len > cfg.max_seq_len:
        raise ConfigError(
            f"prompt_len + gen_len = {prompt_len + gen_len} exceeds the {cfg.max_seq_len}-token "
            f"context of {cfg.name} (model.max_seq_len); shorten the prompt or the generation, "
            "or raise it with --set model.overrides.max_seq_len=N")


def check_workload(batch: int, prompt_len: int, gen_len: int) -> None:
    """Whole numbers within infbench's sanity limits (config.MAX_BATCH, MAX_TOKENS)."""
    check_count("", "batch", batch, MAX_BATCH)
    check_count("", "prompt_len", prompt_len, MAX_TOKENS)
    check_count("", "gen_len", gen_len, MAX_TOKENS)
    if prompt_len + gen_len > MAX_TOKENS:
        raise ConfigError(f"prompt_len + gen_len must be <= {MAX_TOKENS} (2**24), infbench's "
                          f"sanity limit for one context; got {prompt_len + gen_len}")


def _op_times(ops: Sequence[OpCost], rates: Rates) -> tuple[OpTime, ...]:
    out = []
    for op in ops:
        memory, compute = rates.op_times(op)
        out.append(OpTime(op, max(memory, compute), "compute" if compute > memory else "memory"))
    return tuple(out)


def check_overlap(overlap: str) -> None:
    if overlap not in OVERLAP_CHOICES:
        raise ConfigError(f"overlap: unknown value {overlap!r}; allowed: "
                          f"{', '.join(OVERLAP_CHOICES)}")


def default_overlap(hw: HardwareSpec) -> str:
    """What `overlap: auto` means on `hw`: `none` on a profile `infbench calibrate` measured
    through the engine (its kernels run one after another, and on the calibrated CPU the sum
    of per-operator times came within 4% of measured decode steps at batch 1-32 where one
    roofline over the step was up to 22% fast: docs/roofline.md#operator-overlap); `full`,
    the lecture's model, on datasheet entries, where nothing here was measured."""
    engine_terms = any(key in hw.extra for key in (CURVE_KEY, ATTENTION_KEY,
                                                   PREFILL_ATTENTION_KEY))
    return "none" if engine_terms else "full"


def ops_time(ops: Sequence[OpCost], rates: Rates, overlap: str = "full") -> float:
    """Roofline time of a step's operators: one roofline over their sum (full overlap) or
    the sum of each operator's own roofline (none)."""
    if overlap == "none":
        return sum(max(rates.op_times(op)) for op in ops)
    return max(rates.times(ops))


def _stage(stage: str, ops: Sequence[OpCost], rates: Rates, overhead_s: float = 0.0,
           overlap: str = "full", extra_s: float = 0.0) -> StagePrediction:
    step = total(ops, stage, stage)
    return StagePrediction(
        stage,
        step,
        ops_time(ops, rates, overlap) + overhead_s + extra_s,
        rates.bound(ops),
        _op_times(ops, rates),
    )


# ------------------------------------------------------------- exact decode means
def _affine_sum(s: int, e: int, fs: float, fe: float) -> float:
    return (e - s + 1) * (fs + fe) / 2.0


def _sum_max(s: int, e: int, us: float, ue: float, vs: float, ve: float) -> float:
    """sum over x = s..e of max(u(x), v(x)) for affine u, v given at the ends."""
    ds, de = us - vs, ue - ve
    if ds >= 0 and de >= 0:
        return _affine_sum(s, e, us, ue)
    if ds <= 0 and de <= 0:
        return _affine_sum(s, e, vs, ve)
    n = e - s  # > 0 here: a single point cannot have two signs
    k = min(max(s + math.floor(ds / (ds - de) * n), s), e - 1)  # last x on the start's side

    def at(x: int, fs: float, fe: float) -> float:
        return fs + (fe - fs) * (x - s) / n

    return _sum_max(s, k, us, at(k, us, ue), vs, at(k, vs, ve)) + _sum_max(
        k + 1, e, at(k + 1, us, ue), ue, at(k + 1, vs, ve), ve
    )


def _segments(cfg: ModelConfig, query_len: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Ranges of base context on which every cost is affine.

    With q new tokens at base context x the step attends min(p, w) keys for the
    positions p = x..x+q-1; each term bends where p = w, and the keys read bend at x = w.
    A chunked layer (chunk C) starts over at every multiple of C: its terms bend there.
    """
    starts = {lo}
    bends = {spec.window for spec in cfg.layers() if spec.window is not None}
    for c in {spec.chunk for spec in cfg.layers() if spec.chunk is not None}:
        bends.update(range(c, hi + query_len + 2, c))
    for w in bends:
        starts.update(x for x in range(w - query_len + 1, w + 3) if lo < x <= hi)
    ordered = sorted(starts)
    return [(s, (ordered[i + 1] - 1) if i + 1 < len(ordered) else hi)
            for i, s in enumerate(ordered)]


Groups = list[tuple[SeqWork, int]]  # a batch as (sequence, how many such sequences)
Batch = Sequence[SeqWork] | Groups  # a list of sequences, or the same as groups


def as_groups(batch: Batch) -> Groups:
    """(SeqWork, count) groups of a batch given either way, in order of first appearance."""
    if all(isinstance(item, SeqWork) for item in batch):
        return list(Counter(batch).items())  # type: ignore[arg-type]
    return list(batch)  # type: ignore[arg-type]


def _mla_forms(cfg: ModelConfig, groups: Groups) -> tuple[bool, ...]:
    from infbench.roofline.layer_costs import mla_absorbed_is_cheaper

    return tuple(mla_absorbed_is_cheaper(cfg, sw, spec.window)
                 for spec in cfg.layers() if spec.mixer == "mla" for sw, _ in groups)


def mean_stage(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
               make_seqs: Callable[[int], Batch], query_len: int, lo: int, hi: int,
               stage: str = "decode", overlap: str = "full",
               par: ParallelConfig = SINGLE) -> StagePrediction:
    """The exact mean over base contexts lo..hi of steps built by `make_seqs(x)`.

    `make_seqs(x)` returns the step's batch as (SeqWork, count) groups (a plain list of
    SeqWork is grouped first), so a batch of a million identical sequences is one group
    and the cost stays O(1) in the batch.  On more than one device it prices one device's
    share (`roofline.parallel.device_ops`, linear, so the mean stays exact); collectives
    are the caller's.
    """
    def groups_at(x: int) -> Groups:
        return as_groups(make_seqs(x))

    sums: dict[str, list[Any]] = {}
    op_time_sums: dict[str, float] = {}
    time_sum = 0.0
    num_tokens = sum(sw.query_len * n for sw, n in groups_at(lo))
    rates = step_rates(cfg, hw, dtype, num_tokens, stage, quant)
    pending = _segments(cfg, query_len, lo, hi)
    while pending:
        s, e = pending.pop(0)
        seqs_s, seqs_e = groups_at(s), groups_at(e)
        if s < e and _mla_forms(cfg, seqs_s) != _mla_forms(cfg, seqs_e):
            m = (s + e) // 2  # the MLA form flips inside: split until each piece is affine
            pending[:0] = [(s, m), (m + 1, e)]
            continue
        ops_s = device_ops(cfg, seqs_s, dtype, quant, par, stage=stage)
        ops_e = ops_s if s == e else device_ops(cfg, seqs_e, dtype, quant, par, stage=stage)
        for a, b in zip(ops_s, ops_e, strict=True):
            assert a.name == b.name, (a.name, b.name)
            row = sums.setdefault(a.name, [a.kind] + [0.0] * len(FIELDS))
            for i, name in enumerate(FIELDS, start=1):
                row[i] += _affine_sum(s, e, getattr(a, name), getattr(b, name))
            (ma, ca), (mb, cb) = rates.op_times(a), rates.op_times(b)
            op_time_sums[a.name] = op_time_sums.get(a.name, 0.0) + _sum_max(
                s, e, ma, mb, ca, cb)
        (ma, ca), (mb, cb) = rates.times(ops_s), rates.times(ops_e)
        time_sum += _sum_max(s, e, ma, mb, ca, cb)
    count = hi - lo + 1
    ops = [OpCost(name, row[0], stage=stage,
                  **{f: v / count for f, v in zip(FIELDS, row[1:], strict=True)})
           for name, row in sums.items()]
    step = total(ops, stage, stage)
    op_times = tuple(OpTime(op, op_time_sums[op.name] / count, _op_times([op], rates)[0].bound)
                     for op in ops)
    overhead = hw.step_overhead_s(cfg.num_layers, sum(n for _, n in groups_at(lo)))
    if overlap == "none":
        time_sum = sum(op_time_sums.values())
    return StagePrediction(stage, step, time_sum / count + overhead, rates.bound(ops), op_times)


def _speculative(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
                 spec: SpeculativeConfig, batch: int, lo: int, hi: int,
                 decode: StagePrediction, overlap: str = "full",
                 par: ParallelConfig = SINGLE) -> SpecPrediction:
    q = spec.num_tokens + 1
    verify = mean_stage(cfg, hw, dtype, quant,
                        lambda x: [(SeqWork(q, x + q - 1, q), batch)], q, lo, hi, "verify",
                        overlap, par)
    comm = stage_comm(cfg, par, hw, dtype, cfg.layers(), [(SeqWork(q, lo + q - 1, q), batch)],
                      True, True)
    if spec.method == "mtp" and spec.draft_cost_ratio == 0:  # priced from the module itself
        draft = spec.num_tokens * mtp_step_s(cfg, hw, dtype, quant, batch, lo, hi, overlap,
                                             par)
    else:
        draft = spec.num_tokens * spec.draft_cost_ratio * decode.time_s
    step = draft + verify.time_s + comm.total_s
    per_token = step / spec.expected_tokens
    return SpecPrediction(spec, spec.expected_tokens, draft, verify.time_s, step, per_token,
                          decode.time_s / per_token)


def mtp_step_s(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
               batch: int, lo: int, hi: int, overlap: str = "full",
               par: ParallelConfig = SINGLE) -> float:
    """One draft token of DeepSeek-V3's MTP module for the batch, mean over contexts lo..hi:
    its decoder layer over its own cache, the embedding gather, shared_head.norm and the LM
    head (`mtp_model`, priced as a one-layer model's decode step), plus the eh_proj merge
    (2H -> H: its weights read once, 2 FLOPs per weight per token, at the roofline; not
    sharded, as vLLM keeps it whole on every device)."""
    if cfg.num_mtp_layers < 1:
        raise ConfigError(f"speculative.method=mtp: model {cfg.name!r} has no MTP module "
                          "(num_mtp_layers 0); allowed: a model whose checkpoint has one "
                          "(num_nextn_predict_layers >= 1, e.g. deepseek-v3)")
    step = mean_stage(mtp_model(cfg), hw, dtype, quant, lambda x: [(SeqWork(1, x), batch)],
                      1, lo, hi, "mtp", overlap, par)
    merge = Weight("mtp_proj", 2 * cfg.hidden_size, cfg.hidden_size)
    merge_s = max(2.0 * batch * merge.numel / hw.peak(dtype),
                  merge.nbytes(quant, dtype_bytes(dtype)) / hw.bandwidth)
    return step.time_s + merge_s


def _pipeline(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
              par: ParallelConfig, groups: Groups, stage: str, overlap: str
              ) -> tuple[list[float], list[OpCost], CommTime, float, Rates]:
    """One micro-batch's pass through the pipeline: each stage's time on one of its devices
    (compute + its tensor-parallel collectives), the replica's per-device operators summed
    over stages, the communication of one pass, the time of one stage-to-stage hop and the
    rates the operators were priced at."""
    specs = cfg.layers()
    stages = par.stage_layers(cfg.num_layers)
    num_tokens = sum(sw.query_len * n for sw, n in groups)
    rates = step_rates(cfg, hw, dtype, num_tokens, stage, quant)
    by_layer = device_ops(cfg, groups, dtype, quant, par, stage=stage, by_layer=True)
    layer_stage = {j: i for i, layers in enumerate(stages) for j in layers}
    last = len(stages) - 1
    per_stage: list[list[OpCost]] = [[] for _ in stages]
    for op in by_layer:
        if op.layer is not None:
            per_stage[layer_stage[op.layer]].append(op)
        else:  # model level: the embedding on the first stage, final norm and head on the last
            per_stage[0 if op.name == "embed" else last].append(op)
    times: list[float] = []
    comm = CommTime()
    for i, ops in enumerate(per_stage):
        mine = [specs[j] for j in stages[i]]
        c = stage_comm(cfg, par, hw, dtype, mine, groups, i == 0, i == last)
        comm = comm.plus(c)
        overhead = hw.step_overhead_s(len(mine), sum(n for _, n in groups))
        times.append(ops_time(ops, rates, overlap) + overhead + c.total_s)
    hop = hop_s(num_tokens * cfg.hidden_size * dtype_bytes(dtype), 2 * par.tp, hw) \
        if par.pp > 1 else 0.0
    merged = device_ops(cfg, groups, dtype, quant, par, stage=stage)
    return times, merged, comm, hop, rates


def pipeline_pass(cfg: ModelConfig, hw: HardwareSpec, dtype: str, quant: QuantConfig,
                  par: ParallelConfig, groups: Groups, stage: str, overlap: str
                  ) -> tuple[list[float], float]:
    """One micro-batch of `groups` through the pipeline: each stage's seconds on one of its
    devices (compute, its collectives and the per-step overhead) and one stage-to-stage hop
    of its activations (the simulation's pipeline, sim/pipeline_sim.py)."""
    times, _, _, hop, _ = _pipeline(cfg, hw, dtype, quant, par, groups, stage, overlap)
    return times, hop


def _pipelined_stage(stage: str, times: list[float], merged: list[OpCost], hop: float,
                     microbatches: int, rates: Rates, decode: bool
                     ) -> tuple[StagePrediction, float]:
    """A stage (prefill or one decode round) of `microbatches` micro-batches through the
    pipeline, and the fraction of it a device idles (the bubble).

    prefill (GPipe fill and drain): sum(stage times) + hops + (m - 1) x the slowest stage.
    decode round: every micro-batch advances one token; a micro-batch's next token waits
    for its last one to leave the last stage and return (one more hop), so a round is
    max(m x the slowest stage, sum(stage times) + pp hops).
    """
    pp, m = len(times), microbatches
    slowest = max(times)
    if decode:
        time = max(m * slowest, sum(times) + pp * hop)
    else:
        time = sum(times) + (pp - 1) * hop + (m - 1) * slowest
    bubble = 1.0 - m * sum(times) / pp / time
    step = total(merged, stage, stage)
    return StagePrediction(stage, step, time, rates.bound(merged),
                           _op_times(merged, rates)), max(bubble, 0.0)


def predict(
    cfg: ModelConfig,
    hw: HardwareSpec,
    *,
    batch: int,
    prompt_len: int,
    gen_len: int,
    dtype: str = "bfloat16",
    quant: QuantConfig | None = None,
    speculative: SpeculativeConfig | None = None,
    parallel: ParallelConfig = SINGLE,
    overlap: str = "auto",
    reserve: MemoryReserve = DEFAULT_RESERVE,
) -> Prediction:
    """Predict prefill, decode, memory and throughput for `batch` identical requests per
    replica, on one device or `parallel.devices` of them (disaggregated: `batch` is what a
    prefill instance prefills at once and a decode instance decodes)."""
    check_workload(batch, prompt_len, gen_len)
    check_overlap(overlap)
    if overlap == "auto":
        overlap = default_overlap(hw)
    parallel.check_model(cfg)
    if parallel.disaggregated is not None:
        return _disaggregated(cfg, hw, batch, prompt_len, gen_len, dtype, quant, speculative,
                              parallel, overlap, reserve)
    if parallel.devices_per_replica > 1 and hw.interconnect is None:
        raise ConfigError(f"hardware {hw.name!r} has no interconnect figures (a calibrated "
                          "profile describes one device); tp and pp need a table entry")
    quant = quant or QuantConfig()
    par = parallel
    lo, hi = prompt_len + 1, prompt_len + gen_len
    prefill_comm = decode_comm = CommTime()
    bubble = 0.0
    prompts = [(SeqWork(prompt_len, prompt_len), batch)]
    tokens = [(SeqWork(1, lo), batch)]  # one decode step (its collectives do not vary)
    if par.pp == 1:
        prefill_ops = device_ops(cfg, prompts, dtype, quant, par, stage="prefill")
        prefill_comm = stage_comm(cfg, par, hw, dtype, cfg.layers(), prompts, True, True)
        prefill = _stage("prefill", prefill_ops,
                         step_rates(cfg, hw, dtype, batch * prompt_len, "prefill", quant),
                         hw.step_overhead_s(cfg.num_layers, batch), overlap,
                         prefill_comm.total_s)
        decode = mean_stage(cfg, hw, dtype, quant, lambda x: [(SeqWork(1, x), batch)], 1, lo, hi,
                            overlap=overlap, par=par)
        decode_comm = stage_comm(cfg, par, hw, dtype, cfg.layers(), tokens, True, True)
        if decode_comm.total_s:
            decode = replace(decode, time_s=decode.time_s + decode_comm.total_s)
    else:
        if speculative is not None:
            raise ConfigError("speculative decoding is not modelled with pipeline parallelism "
                              "(pp > 1); drop the speculative settings or use pp 1")
        m = par.num_microbatches(batch)
        micro = math.ceil(batch / m)  # the largest micro-batch sets the stage time
        prompts, tokens = [(SeqWork(prompt_len, prompt_len), micro)], [(SeqWork(1, lo), micro)]
        times, merged, prefill_comm, hop, rates = _pipeline(
            cfg, hw, dtype, quant, par, [(SeqWork(prompt_len, prompt_len), micro)], "prefill",
            overlap)
        prefill, _ = _pipelined_stage("prefill", times, merged, hop, m, rates, decode=False)
        mid = (lo + hi) // 2  # pp > 1: the decode step is priced at the middle context
        times, merged, decode_comm, hop, rates = _pipeline(
            cfg, hw, dtype, quant, par, [(SeqWork(1, mid), micro)], "decode", overlap)
        decode, bubble = _pipelined_stage("decode", times, merged, hop, m, rates, decode=True)
        decode_comm = CommTime(decode_comm.all_reduce_s * m, decode_comm.all_gather_s * m,
                               decode_comm.all_to_all_s * m, par.pp * hop * m)
    spec = None
    per_token = decode.time_s
    if speculative is not None:
        spec = _speculative(cfg, hw, dtype, quant, speculative, batch, lo, hi, decode, overlap,
                            par)
        per_token = spec.time_per_token_s

    context = prompt_len + gen_len
    mem = device_memory(cfg, hw, dtype, quant, context, batch, par, reserve)
    return Prediction(
        model=cfg.name, hardware=hw.name, dtype=dtype, quant=quant, batch=batch,
        prompt_len=prompt_len, gen_len=gen_len, params=param_count(cfg),
        weight_bytes=mem.weight_bytes, kv_bytes_per_token=kv_bytes_per_token(cfg, dtype, quant),
        kv_cache_bytes=mem.kv_cache_bytes, state_bytes=mem.state_bytes,
        memory_bytes=mem.memory_bytes, memory_capacity_bytes=hw.memory_bytes, fits=mem.fits,
        max_batch=max_batch(cfg, hw, dtype, quant, context, par, reserve),
        prefill=prefill, decode=decode, ttft_s=prefill.time_s,
        time_per_token_s=per_token, tokens_per_s=batch * par.replicas / per_token,
        e2e_s=prefill.time_s + (gen_len - 1) * per_token, speculative=spec,
        parallel=par, overlap=overlap, usable_memory_bytes=mem.usable_bytes,
        workspace_bytes=mem.workspace_bytes, prefill_comm=prefill_comm,
        decode_comm=decode_comm, pipeline_bubble=bubble,
        prefill_all_to_all=all_to_all_plan(cfg, par, hw, dtype, prompts),
        decode_all_to_all=all_to_all_plan(cfg, par, hw, dtype, tokens),
    )


def _disaggregated(cfg: ModelConfig, hw: HardwareSpec, batch: int, prompt_len: int,
                   gen_len: int, dtype: str, quant: QuantConfig | None,
                   speculative: SpeculativeConfig | None, parallel: ParallelConfig,
                   overlap: str, reserve: MemoryReserve) -> Prediction:
    """Prefill on the prefill pool (its memory at the prompt), the prompts' KV across, decode
    on the decode pool (its memory at prompt + gen): TTFT = prefill + transfer (the first
    token leaves with the cache), TPOT the decode instance's, the rest of the prediction
    (memory, max batch, decode) the decode pool's, `fits` both pools'."""
    pools = parallel.disaggregated
    assert pools is not None
    pre = predict(cfg, hw, batch=batch, prompt_len=prompt_len, gen_len=1, dtype=dtype,
                  quant=quant, parallel=pools.prefill, overlap=overlap, reserve=reserve)
    dec = predict(cfg, hw, batch=batch, prompt_len=prompt_len, gen_len=gen_len, dtype=dtype,
                  quant=quant, speculative=speculative, parallel=pools.decode, overlap=overlap,
                  reserve=reserve)
    q = quant or QuantConfig()
    held = kv_cache_bytes(cfg, dtype, q, prompt_len, batch) + \
        state_bytes_per_seq(cfg, dtype) * batch
    transfer = kv_transfer(held if gen_len > 1 else 0.0, pools, hw)
    ttft = pre.ttft_s + (transfer.time_s if gen_len > 1 else 0.0)
    decode_s = (gen_len - 1) * dec.time_per_token_s

    def pool(p: Prediction, par: ParallelConfig, seconds: float) -> PoolPrice:
        rate = par.replicas * batch / seconds if seconds > 0 else 0.0
        return PoolPrice(par.replicas, par.devices, seconds, rate, p.memory_bytes, p.fits,
                         p.max_batch)

    # a prefill instance starts its next batch once this one's cache has left
    prefill_s = max(pre.prefill.time_s, transfer.time_s)
    summary = Disaggregated(pool(pre, pools.prefill, prefill_s),
                            pool(dec, pools.decode, decode_s), transfer)
    return replace(
        dec, prefill=pre.prefill, ttft_s=ttft, e2e_s=ttft + decode_s, parallel=parallel,
        fits=pre.fits and dec.fits, max_batch=min(pre.max_batch, dec.max_batch),
        prefill_comm=pre.prefill_comm, prefill_all_to_all=pre.prefill_all_to_all,
        tokens_per_s=batch * pools.decode.replicas / dec.time_per_token_s,
        disaggregated=summary)


def _stage_dict(stage: StagePrediction) -> dict[str, Any]:
    c = stage.cost
    return {
        "flops": c.flops,
        "bytes": c.bytes,
        "intensity": c.intensity,
        "time_s": stage.time_s,
        "bound": stage.bound,
        "weight_bytes": c.weight_bytes,
        "kv_read_bytes": c.kv_read_bytes,
        "kv_write_bytes": c.kv_write_bytes,
        "state_bytes": c.state_bytes,
        "act_bytes": c.act_bytes,
    }


def prediction_dict(p: Prediction) -> dict[str, Any]:
    """The JSON object of one prediction (bytes in bytes, times in seconds)."""
    decodes = p.gen_len > 1  # gen_len 1: the one token comes from the prefill
    decode = _stage_dict(p.decode)
    decode["step_time_s"] = decode.pop("time_s")
    decode["time_per_token_s"] = p.time_per_token_s if decodes else None
    spec = None
    if p.speculative is not None:
        s = p.speculative
        spec = {
            **s.config.priced(),
            "expected_tokens_per_step": s.expected_tokens_per_step,
            "draft_time_s": s.draft_time_s,
            "verify_time_s": s.verify_time_s,
            "step_time_s": s.step_time_s,
            "time_per_token_s": s.time_per_token_s,
            "speedup": s.speedup,
        }
    return {
        "model": p.model,
        "hardware": p.hardware,
        "dtype": p.dtype,
        "quant": asdict(p.quant),
        "batch": p.batch,
        "prompt_len": p.prompt_len,
        "gen_len": p.gen_len,
        "params": p.params.total,
        "active_params": p.params.active,
        "mtp_params": p.params.mtp,  # DeepSeek-V3's MTP modules as stored (not in params)
        "weight_bytes": p.weight_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "kv_cache_bytes": p.kv_cache_bytes,
        "state_bytes": p.state_bytes,
        "memory_bytes": p.memory_bytes,
        "memory_capacity_bytes": p.memory_capacity_bytes,
        "fits": p.fits,
        "max_batch": p.max_batch,
        "ttft_s": p.ttft_s,
        "e2e_s": p.e2e_s,
        # The measured metrics' names and definitions (docs/results.md#metric-definitions):
        # TPOT = (E2E - TTFT) / (gen_len - 1); decode-only and end-to-end rates apart.
        "tpot_s": (p.e2e_s - p.ttft_s) / (p.gen_len - 1) if p.gen_len >= 2 else None,
        "decode_tokens_per_s": p.tokens_per_s if decodes else None,
        "output_tokens_per_s": p.batch * p.parallel.replicas * p.gen_len / p.e2e_s,
        "prefill": _stage_dict(p.prefill),
        "decode": decode,
        "speculative": spec,
        "ops": [op.to_dict() for stage in ((p.prefill, p.decode) if decodes else (p.prefill,))
                for op in stage.ops],
    }


def layout_dict(par: ParallelConfig, batch: int) -> dict[str, Any]:
    """A layout as `predict --json` shows it (disaggregated: each pool's)."""
    if par.disaggregated is not None:
        pools = par.disaggregated
        return {"disaggregated": {"prefill": layout_dict(pools.prefill, batch),
                                  "decode": layout_dict(pools.decode, batch)},
                "devices": par.devices}
    return {"tp": par.tp, "pp": par.pp, "ep": par.ep, "replicas": par.replicas,
            "microbatches": par.num_microbatches(batch) if par.pp > 1 else 1,
            "attention_dp": par.attention_dp, "dispatch_dtype": par.dispatch_dtype,
            "dense_dp": par.dense_dp, "devices": par.devices}


def deployment_dict(p: Prediction) -> dict[str, Any]:
    """What `predict --json` adds to `prediction_dict` (a result file's prediction keeps the
    schema's keys): the parallel layout, the memory budget and the communication."""
    par = p.parallel
    return {
        "parallel": layout_dict(par, p.batch),
        "overlap": p.overlap,
        "usable_memory_bytes": p.usable_memory_bytes,
        "workspace_bytes": p.workspace_bytes,
        "prefill_comm_s": asdict(p.prefill_comm),
        "decode_comm_s": asdict(p.decode_comm),
        "pipeline_bubble": p.pipeline_bubble,
        # expert parallel: one MoE layer's dispatch and combine on one device, per step
        "all_to_all": {stage: a.to_dict() if a else None for stage, a in
                       (("prefill", p.prefill_all_to_all), ("decode", p.decode_all_to_all))},
        "disaggregated": p.disaggregated.to_dict(p.gen_len) if p.disaggregated else None,
    }
