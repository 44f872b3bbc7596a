"""The analytic prediction of a scenario point: the one path that prices a point.

`infbench predict` (a scenario file, or the document its flags build), the prediction
`infbench run` and the client record next to their measurements (`predict_point`, read back
by `report`, `compare` and the plots) all come through `price`, so one point gets the same
numbers everywhere.  A point's prediction prices (docs/roofline.md has the page):

- the workload as it runs: kind static in waves of `batch_size`, offline in waves of
  `max_concurrency` (all requests when unset), each wave capped at `engine.max_num_seqs`, the
  waves back to back.  Poisson arrivals depend on queueing the roofline does not model, and
  dataset workloads vary their lengths per request: neither is predicted, rather than guessed;
- the model as it runs (preset or checkpoint, overrides, attention, prune), the dtype and
  `model.quant` (with `PricingOptions.kv_bits`, an analytic-only width);
- `speculative:` when its method is not none: g = num_tokens draft tokens accepted at the
  scenario's `acceptance`, drafts at `draft_cost_ratio` of a target step;
- `parallel:`: tp / pp / ep shards and their collectives; each of the replicas serves a copy
  of the workload (batch_size and the requests are per replica, as the roofline's batch);
  `parallel.disaggregated`: the waves pipelined through a prefill and a decode pool (the
  first wave's E2E, then a wave per batch / the slower pool's requests per second);
- the hardware entry or calibrated profile (its measured rates and its flags), the operator
  overlap (auto: none on an engine-calibrated profile, full on a datasheet) and the reserve.

The names mean what the measured metrics mean (docs/results.md#metric-definitions):
`ttft_s`, `tpot_s` = (E2E - TTFT) / (gen_len - 1) and `e2e_s` of one request of the first
wave; `output_tokens_per_s` and `total_tokens_per_s` end to end (tokens / the predicted wall
time of the whole workload, prefill included); `decode_tokens_per_s` the decode-only rate
(batch / decode time per token), which has no measured twin.  `profile_flags` carries the
flags of a calibrated profile (`HardwareSpec.profile_flags`, [] when it has none) so that
`run` and `report` can say a prediction rests on doubtful figures; datasheet entries leave
it out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import UserError
from infbench.core.parallel import SINGLE, ParallelConfig
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.request import Request
from infbench.hardware.spec import CURVE_KEY, HardwareSpec, MemoryReserve, get_hardware
from infbench.measure.model_shapes import model_configs
from infbench.roofline.analysis import (
    DEFAULT_RESERVE,
    Prediction,
    check_context,
    predict,
    prediction_dict,
    quantized_rates,
)

if TYPE_CHECKING:  # annotations only: predict's flag-only path never loads the scenario schema
    from infbench.engine.session_loop import Conversation
    from infbench.scenario.point import ScenarioPoint, WorkloadPoint


@dataclass(frozen=True)
class Efficiency:
    """The achievable fractions of a datasheet's peaks (`predict --efficiency`): memory
    bandwidth and every compute peak are multiplied by them; the interconnect is not.
    `label` says where they come from (a number given, or an engine's fit)."""

    bandwidth: float
    compute: float
    label: str = ""

    def __post_init__(self) -> None:
        for key in ("bandwidth", "compute"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise UserError(f"efficiency {key} must be a fraction in (0, 1], got {value}")


def derate(hw: HardwareSpec, efficiency: Efficiency) -> HardwareSpec:
    """`hw` at `efficiency` of its bandwidth and compute peaks.  A calibrated profile's
    rates are measured already: derating one is refused."""
    if hw.extra:
        raise UserError(f"--efficiency applies to datasheet hardware; {hw.name!r} is a "
                        "calibrated profile (its rates are measured); allowed: a table entry")
    peaks = {dtype: flops * efficiency.compute for dtype, flops in hw.peak_flops.items()}
    return replace(hw, peak_flops=peaks, bandwidth=hw.bandwidth * efficiency.bandwidth,
                   description=f"{hw.description} at {efficiency.bandwidth:.0%} of its "
                               f"bandwidth, {efficiency.compute:.0%} of its compute peaks")


@dataclass(frozen=True)
class PricingOptions:
    """The analytic-only knobs of `infbench predict`; the defaults are what `run` records."""

    speculative: SpeculativeConfig | None = None  # replaces the point's speculative section
    overlap: str = "auto"  # one of roofline.analysis.OVERLAP_CHOICES
    reserve: MemoryReserve = DEFAULT_RESERVE
    kv_bits: int | None = None  # bits per cached K/V value, replacing model.quant's
    efficiency: Efficiency | None = None  # derates the hardware's peaks (None: the roofline)
    simulate: bool = True  # also run the point through the simulated engine (prediction.metrics)


@dataclass(frozen=True)
class PricedWorkload:
    """What is priced: `batch` identical requests at once per replica, `num_sequences` of
    them per replica run in waves of `batch`, back to back."""

    batch: int
    num_sequences: int
    prompt_len: int
    gen_len: int
    dtype: str
    quant: QuantConfig
    speculative: SpeculativeConfig | None = None
    parallel: ParallelConfig = SINGLE

    @property
    def waves(self) -> int:
        return math.ceil(self.num_sequences / self.batch)


@dataclass(frozen=True)
class PointPrice:
    """A point's prediction, or why it has none (`prediction` None, `note` the reason)."""

    hardware: str
    prediction: Prediction | None = None
    workload: PricedWorkload | None = None
    note: str = ""  # not predicted: why; predicted: what the numbers leave out ("; "-joined)
    profile_flags: tuple[str, ...] | None = None  # a calibrated profile's; None: a datasheet
    # the point under its load (measure/simulation.py): the `metrics` shape, or None with
    # `simulation_note` saying why; the note also says what the simulation assumed
    metrics: dict[str, Any] | None = None
    simulation_note: str = ""
    request_overhead_s: float = 0.0  # a client point's term in `metrics` (target:)

    def to_dict(self) -> dict[str, Any]:
        """The prediction under the result schema's keys (`results.schema.Prediction`)."""
        d = self._roofline_dict()
        if self.metrics is not None:
            d["metrics"] = self.metrics
        if self.simulation_note:
            d["simulation_note"] = self.simulation_note
        if self.request_overhead_s:
            d["request_overhead_s"] = self.request_overhead_s
        return d

    def _roofline_dict(self) -> dict[str, Any]:
        p, w = self.prediction, self.workload
        if p is None or w is None:
            return {"hardware": self.hardware, "note": self.note}
        d = prediction_dict(p)  # ttft_s, tpot_s, e2e_s, decode_tokens_per_s of one wave
        num_sequences = w.num_sequences * w.parallel.replicas
        wall = w.waves * p.e2e_s  # waves run back to back
        if p.disaggregated is not None:  # pipelined: the pools work on different waves
            wall = p.disaggregated.wall_s(p.e2e_s, w.waves, w.batch)
        d.update({
            "hardware": self.hardware,
            "output_tokens_per_s": num_sequences * w.gen_len / wall,
            "total_tokens_per_s": num_sequences * (w.prompt_len + w.gen_len) / wall,
            "waves": w.waves,
            "overlap": p.overlap,
        })
        if self.profile_flags is not None:
            d["profile_flags"] = list(self.profile_flags)
        if self.note:
            d["note"] = self.note
        return d


def with_kv_bits(quant: QuantConfig, kv_bits: int | None) -> QuantConfig:
    """`quant` with its cache width replaced by `kv_bits` (None: unchanged)."""
    return quant if kv_bits is None else replace(quant, kv_bits=kv_bits)


def point_speculative(point: ScenarioPoint) -> SpeculativeConfig | None:
    """The roofline's speculative config of the point's `speculative:` section (None: off)."""
    s = point.speculative
    return s if s.enabled else None


def unpredicted(workload: WorkloadPoint) -> str:
    """Why the roofline does not price this workload; '' when it does (the simulation's
    `metrics` predicts every kind)."""
    if workload.kind == "poisson":
        return "roofline not priced: Poisson arrivals (queueing; see prediction.metrics)"
    if workload.kind == "sessions":
        return ("roofline not priced: multi-turn sessions (each turn's prompt grows by the "
                "history; see prediction.metrics)")
    if workload.kind == "trace" or workload.dataset is not None:
        return ("roofline not priced: prompt and output lengths from a dataset (the roofline "
                "prices one shape; see prediction.metrics)")
    return ""


def point_workload(point: ScenarioPoint,
                   options: PricingOptions = PricingOptions()) -> PricedWorkload:
    """The waves a static or offline point runs, with its dtype, quant, speculative and
    parallel sections (and the options that replace them)."""
    w = point.workload
    num_sequences = w.num_prompts * w.samples_per_prompt
    # static runs batch_size at a time (a client cap); offline is capped by the engine only
    at_once = w.batch_size * w.samples_per_prompt if w.kind == "static" else num_sequences
    if w.max_concurrency is not None:
        at_once = min(at_once, w.max_concurrency * w.samples_per_prompt)
    return PricedWorkload(
        batch=min(at_once, point.engine.max_num_seqs), num_sequences=num_sequences,
        prompt_len=w.prompt_len, gen_len=w.gen_len, dtype=point.dtype,
        quant=with_kv_bits(point.quant_config(), options.kv_bits),
        speculative=options.speculative or point_speculative(point), parallel=point.parallel)


def price(cfg: ModelConfig, hw: HardwareSpec, workload: PricedWorkload, *,
          overlap: str = "auto", reserve: MemoryReserve = DEFAULT_RESERVE) -> PointPrice:
    """Price `workload` of `cfg` on `hw`: the roofline prediction of one wave, the waves,
    the profile's flags and what the numbers leave out."""
    w = workload
    p = predict(cfg, hw, batch=w.batch, prompt_len=w.prompt_len, gen_len=w.gen_len,
                dtype=w.dtype, quant=w.quant, speculative=w.speculative, parallel=w.parallel,
                overlap=overlap, reserve=reserve)
    notes = []
    if w.quant.method == "llm_int8":  # its outlier count is known after loading
        notes.append("llm_int8 priced as int8: the outlier columns it keeps in the model dtype "
                     "(chosen on calibration text) are not in the predicted weight bytes; the "
                     "measured weight_bytes count them")
    if (w.quant.weights != "none" and CURVE_KEY in hw.extra
            and not quantized_rates(cfg, hw, w.quant, w.batch)):
        notes.append(f"quantized projections priced at the {w.dtype} matmul curve of "
                     f"profile {hw.name!r}: it has no curve of the kernels these weights run "
                     "(calibrate measures int8 and int4 with float activations on the C++ "
                     "backend), so their smaller weight reads are not credited")
    # a calibrated profile has extra details; a datasheet entry has none and no flags
    flags = tuple(hw.profile_flags) if hw.extra else None
    return PointPrice(hw.name, p, w, "; ".join(notes), flags)


def price_point(point: ScenarioPoint, cfg: ModelConfig, hw: HardwareSpec,
                options: PricingOptions = PricingOptions(), *,
                requests: Sequence[Request] | None = None,
                conversations: Sequence[Conversation] | None = None, tokenizer: Any = None,
                eos_token_id: int | None = None) -> PointPrice:
    """Price one scenario point of model shape `cfg` on `hw`: the roofline of its waves
    (static and offline points) and, for every kind, its simulated run under load (of
    `requests`, or a sessions point's `conversations`, when given: the ones a run served).
    An analytic refusal (tp that does not divide the heads, speculative with pp > 1, ...)
    is a UserError naming the point."""
    reason = unpredicted(point.workload)
    try:
        priced = PointPrice(hw.name, note=reason) if reason else price(
            cfg, hw, point_workload(point, options), overlap=options.overlap,
            reserve=options.reserve)
        if options.simulate:
            priced = with_simulation(priced, point, cfg, hw, options, requests,
                                     conversations, tokenizer, eos_token_id)
    except UserError as exc:
        raise UserError(f"{point.source}: {point.where()}{exc}") from None
    return priced


def with_simulation(priced: PointPrice, point: ScenarioPoint, cfg: ModelConfig,
                    hw: HardwareSpec, options: PricingOptions,
                    requests: Sequence[Request] | None,
                    conversations: Sequence[Conversation] | None, tokenizer: Any,
                    eos_token_id: int | None) -> PointPrice:
    """`priced` with the point's simulated metrics, or the reason it has none."""
    from infbench.measure.simulation import simulate_point, unsimulated

    reason = unsimulated(point)
    if reason or options.speculative is not None or options.kv_bits is not None:
        # predict's analytic-only knobs change the roofline, not the engine that would run
        return replace(priced, simulation_note=reason or "not simulated: analytic-only "
                       "options (--spec-*, --kv-bits) have no engine to run")
    sim = simulate_point(point, cfg, hw, requests=requests, conversations=conversations,
                         tokenizer=tokenizer, eos_token_id=eos_token_id,
                         overlap=options.overlap)
    return replace(priced, metrics=sim.metrics, simulation_note=sim.note,
                   request_overhead_s=sim.request_overhead_s)


def _check_context(point: ScenarioPoint, cfg: ModelConfig) -> None:
    """The point's longest request within the model's context: a session's longest turn
    (its history with every earlier reply at max_tokens), as the run's pre-flight checks."""
    w = point.workload
    if w.kind != "sessions":
        check_context(cfg, w.prompt_len, w.gen_len)
        return
    from infbench.measure.sessions import session_lengths

    prompts, outs = session_lengths(w)
    longest = int((prompts + outs).argmax())
    prompt, gen = int(prompts[longest]), int(outs[longest])
    if prompt + gen > cfg.max_seq_len:
        raise UserError(f"workload.sessions: the longest turn's prompt (its history with every "
                        f"earlier reply at max_tokens) + output = {prompt} + {gen} tokens "
                        f"exceeds the {cfg.max_seq_len}-token context of {cfg.name} "
                        "(model.max_seq_len); allowed: fewer turns or shorter messages")


def price_points(points: list[ScenarioPoint],
                 options: PricingOptions = PricingOptions()) -> list[PointPrice]:
    """`infbench predict`'s points: each model shape read once, each context checked against
    the model's (`run` leaves that to the engine), each point priced on its hardware."""
    prices = []
    for point, cfg in zip(points, model_configs(points), strict=True):
        try:
            _check_context(point, cfg)
        except UserError as exc:
            raise UserError(f"{point.source}: {point.where()}{exc}") from None
        hw = get_hardware(point.hardware)
        if options.efficiency is not None:
            hw = derate(hw, options.efficiency)
        tokenizer = None
        if options.simulate:
            from infbench.measure.simulation import point_tokenizer

            tokenizer = point_tokenizer(point)
        prices.append(price_point(point, cfg, hw, options, tokenizer=tokenizer,
                                  eos_token_id=getattr(tokenizer, "eos_token_id", None)))
    return prices


def predict_point(point: ScenarioPoint, cfg: ModelConfig, hw: HardwareSpec, *,
                  requests: Sequence[Request] | None = None,
                  conversations: Sequence[Conversation] | None = None, tokenizer: Any = None,
                  eos_token_id: int | None = None) -> dict[str, Any]:
    """The prediction `run` and the client record beside a measured point (`cfg`: the shape
    that ran; `requests`, or a sessions point's `conversations`: the ones it served,
    simulated as `prediction.metrics`).  A combination the roofline refuses is recorded as
    not predicted, with the reason, so a finished measurement is still written; so is one
    the simulation refuses."""
    try:
        return price_point(point, cfg, hw, requests=requests, conversations=conversations,
                           tokenizer=tokenizer, eos_token_id=eos_token_id).to_dict()
    except UserError as exc:
        try:  # the roofline alone, when it was the simulation that refused
            d = price_point(point, cfg, hw, replace_options(simulate=False)).to_dict()
        except UserError:
            return {"hardware": hw.name, "note": f"not predicted: {exc}"}
        d["simulation_note"] = f"not simulated: {exc}"
        return d


def replace_options(**changes: Any) -> PricingOptions:
    """The default options with `changes`."""
    return replace(PricingOptions(), **changes)
