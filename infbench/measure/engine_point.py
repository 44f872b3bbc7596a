"""The stages of one engine point, in the order `bench.run_point` calls them.

load -> plan requests -> torch reference -> start engine -> warm up -> measure repeats
(each with the same-run reference bandwidth, the torch reference bracket and the
speculative plain baseline) -> accuracy -> telemetry (NVML, ncu) -> summarize and
predict -> assemble the result.  Each stage takes and returns typed values: `LoadedPoint`
(the model as loaded), `RequestPlan` (the requests and how they are released),
`Measured` (the repeats' metrics and the last repeat's records), `Summary`.

This module imports torch, the engine and the model at its top; `bench` imports it only
for an engine point, so a run against a server (`target:`) never loads them.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from infbench.core.config import ModelConfig, PruneConfig, QuantConfig
from infbench.core.errors import ConfigError, UserError
from infbench.core.speculative import SpeculativeConfig
from infbench.engine.engine import Engine, KVSizing, RunOutput
from infbench.engine.kv_cache import kv_quant_refusal
from infbench.engine.records import StepRecord
from infbench.engine.request import Request
from infbench.engine.session_loop import Conversation, sizing_requests
from infbench.hardware.spec import HardwareSpec
from infbench.measure import accuracy as accuracy_mod
from infbench.measure import calibrate
from infbench.measure import metrics as metrics_mod
from infbench.measure import speculative as spec_mod
from infbench.measure.engine_sessions import run_engine_sessions
from infbench.measure.goodput import goodput_metrics
from infbench.measure.machine import resolve_hardware
from infbench.measure.model_cache import ModelCache
from infbench.measure.moe_routing import routing_metrics
from infbench.measure.prediction import predict_point
from infbench.measure.sessions import plan_sessions, sessions_metrics, tag_rows
from infbench.measure.telemetry import NvmlSampler, ncu_profile
from infbench.measure.torch_reference import (
    SUPPORTED_ATTENTION,
    ReferencePlan,
    SameRunReference,
    TorchReference,
    unsupported_reason,
)
from infbench.measure.traffic import annotate_steps, stage_traffic
from infbench.measure.windows import add_window, duration_note, timed_workload
from infbench.measure.workload import draw_workload
from infbench.model.dtypes import TORCH_DTYPES
from infbench.model.loader import LoadedModel, load_model
from infbench.results import store as results_mod
from infbench.results.prefix import with_measured
from infbench.scenario.point import ModelPoint, ScenarioPoint
from infbench.scenario.workload import WorkloadPoint

Phase = Callable[[str], None]  # the progress line's current phase ("repeat 2/3")


def note(point: ScenarioPoint, text: str) -> None:
    """One `note:` line on stderr, naming the point."""
    print(f"note: {point.name} point {point.index} ({point.label}): {text}", file=sys.stderr)


def speculation(point: ScenarioPoint) -> SpeculativeConfig | None:
    """The point's speculative decoding, or None when it decodes plainly."""
    return point.speculative if point.speculative.enabled else None


# ---- load ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedPoint:
    """The point's model as loaded on the resolved device."""

    model: LoadedModel
    device: str  # cpu | cuda (resolved)
    key: str  # the model cache's key; accuracy names the point's model by it
    eval_plan: accuracy_mod.EvalPlan | None  # accuracy to measure; None: none for this point

    @property
    def config(self) -> ModelConfig:
        return self.model.config


def refuse_kv_quant(point: ScenarioPoint, device: str, cfg: ModelConfig | None = None) -> None:
    """model.quant.kv the device (or, given cfg, the model) cannot run: one line."""
    kv = point.quant_config().kv
    reason = kv_quant_refusal(kv, torch.device(device), cfg)
    if reason is not None:
        raise UserError(f"{point.source}: model.quant.kv={kv!r}: {reason}")


def _model_section(point: ScenarioPoint) -> ModelPoint:
    assert point.model is not None  # an engine point has a model section
    return point.model


def _load_model(point: ScenarioPoint, device: str, quant: QuantConfig | None = None,
                prune: PruneConfig | None = None) -> LoadedModel:
    """The point's source, shape, dtype and weights; quantized and pruned when given."""
    model = _model_section(point)
    return load_model(point.model_source(), dtype=point.dtype, device=device,
                      seed=point.workload.seed, overrides=model.changes(),
                      weights=model.weights, quant=quant, prune=prune)


def load(point: ScenarioPoint, device: str, cache: ModelCache, phase: Phase) -> LoadedPoint:
    """The point's model (from `cache` when the previous point loaded the same one), its
    accuracy plan, and the KV-quant check that needs the model's shape."""
    model, quant, prune = _model_section(point), point.quant_config(), point.prune_config()
    key = repr((sorted(point.model_source().items()), sorted(model.changes().items(), key=str),
                point.dtype, device, model.weights, quant, prune))
    phase("loading model")
    loaded = cache.get(key, lambda: _load_model(point, device, quant=quant, prune=prune))
    eval_plan = accuracy_mod.point_plan(point, loaded)
    refuse_kv_quant(point, device, loaded.config)
    return LoadedPoint(loaded, device, key, eval_plan)


# ---- plan requests -------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestPlan:
    """The point's requests and how the client releases them."""

    requests: list[Request]
    max_concurrency: int | None  # the client's cap on outstanding requests; None: no cap
    is_realtime: bool  # timed repeats release them at their arrival times (warm-ups: at once)
    prefix: dict[str, Any] | None = None  # the prefix groups' summary (measure/prefix.py)
    submit_until_s: float | None = None  # measure.duration_s: none submitted after it
    # workload.kind sessions: the conversations, played by measure/engine_sessions.py
    # (`requests` then holds one request per session at its longest, to size the KV pool)
    conversations: list[Conversation] | None = None
    workload: WorkloadPoint | None = None
    eos_token_id: int | None = None

    def run(self, engine: Engine, realtime: bool,
            on_step: Callable[[StepRecord], None] | None = None) -> RunOutput:
        """One pass: the requests through `Engine.run`, or the sessions' closed loop."""
        if self.conversations is not None:
            assert self.workload is not None
            return run_engine_sessions(engine, self.conversations, self.workload,
                                       realtime=realtime, on_step=on_step,
                                       max_concurrency=self.max_concurrency,
                                       eos_token_id=self.eos_token_id)
        return engine.run(self.requests, realtime_arrivals=realtime, on_step=on_step,
                          max_concurrency=self.max_concurrency,
                          submit_until_s=self.submit_until_s)


def plan_requests(point: ScenarioPoint, loaded: LoadedPoint,
                  max_concurrency: int | None) -> RequestPlan:
    """The workload's requests for this model's vocabulary, tokenizer and context, run at
    most `max_concurrency` at a time (bench.client_concurrency)."""
    tok = loaded.model.tokenizer
    eos = tok.eos_token_id if tok is not None else None
    if point.workload.kind == "sessions":
        conversations = plan_sessions(point.workload, loaded.config.vocab_size, tokenizer=tok,
                                      eos_token_id=eos)
        return RequestPlan(sizing_requests(conversations), max_concurrency, True,
                           conversations=conversations, workload=point.workload,
                           eos_token_id=eos)
    drawn = draw_workload(timed_workload(point), loaded.config.vocab_size, tokenizer=tok,
                          eos_token_id=eos, max_model_len=loaded.config.max_seq_len)
    return RequestPlan(drawn.requests, max_concurrency, point.workload.is_realtime,
                       drawn.prefix, point.measure.duration_s)


# ---- reference: the plain-torch model timed beside the repeats -----------------------------
def torch_reference(point: ScenarioPoint, loaded: LoadedPoint,
                    plan: RequestPlan) -> SameRunReference | None:
    """measure.torch_reference's plain-torch model of the point, or None when not asked.

    Built before the engine, so a GPU's KV budget already counts its weights.
    """
    if not point.measure.torch_reference:
        return None
    reason = unsupported_reason(loaded.config)
    if reason is not None:
        raise UserError(f"measure.torch_reference: the plain-torch reference does not run "
                        f"{reason}; it runs Llama-family models with attention.kind "
                        f"{', '.join(SUPPORTED_ATTENTION)} (set measure.torch_reference: false "
                        "and gate on another normalize mode)")
    reference = TorchReference(loaded.config, TORCH_DTYPES[point.dtype], loaded.device,
                               seed=point.workload.seed)
    ref_plan = ReferencePlan.for_requests(plan.requests, point.engine.max_num_seqs)
    return SameRunReference(reference, ref_plan, seed=point.workload.seed)


class ReferenceBracket:
    """The torch reference timed just before and just after each repeat, so a machine that
    speeds up or slows down during the run moves both sides alike."""

    def __init__(self, reference: SameRunReference, phase: Phase) -> None:
        phase("torch reference")
        reference.time()  # warm once, then time the pass before repeat 1
        self.reference = reference
        self.before = reference.time()

    def after_repeat(self) -> dict[str, Any]:
        """`metrics.torch_reference` of the repeat just run; its end starts the next one."""
        after = self.reference.time()
        figures = self.reference.bracket(self.before, after)
        self.before = after
        return figures


# ---- start the engine, warm up -------------------------------------------------------------
def start_engine(point: ScenarioPoint, loaded: LoadedPoint, plan: RequestPlan) -> Engine:
    """The engine for the point, sized for its requests; a note per feature it turned off."""
    if loaded.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    engine_cfg = point.engine
    with warnings.catch_warnings():  # reported below, once per point, from engine.disabled
        warnings.filterwarnings("ignore", message="engine.cuda_graphs ignored")
        try:
            engine = Engine.create(
                loaded.model, engine_cfg, loaded.device, point.dtype, seed=point.workload.seed,
                sizing=KVSizing.for_requests(plan.requests, engine_cfg.block_size),
                kv_quant=point.quant_config().kv, speculative=speculation(point),
                source=point.model_source())
        except ConfigError as exc:
            raise UserError(f"{point.source}: {exc}") from None
    for item in engine.disabled:
        note(point, f"engine.{item['feature']} is off for this model: {item['reason']}")
    return engine


def _plain_run(engine: Engine, plan: RequestPlan, realtime: bool) -> RunOutput:
    """The requests decoded without speculation (the speculative point's baseline)."""
    engine.set_speculation(False)
    out = plan.run(engine, realtime)
    engine.set_speculation(True)
    return out


def warm_up(point: ScenarioPoint, engine: Engine, plan: RequestPlan, phase: Phase) -> None:
    """measure.warmup untimed passes, every request released at once."""
    for i in range(point.measure.warmup):
        phase(f"warm-up {i + 1}/{point.measure.warmup}")
        plan.run(engine, realtime=False)
        if speculation(point) is not None:  # the plain baseline is timed too: warm it as well
            _plain_run(engine, plan, realtime=False)


# ---- measure repeats -----------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """The timed repeats: one metrics dict each, and the last repeat's records (a result
    stores the steps and per-request rows of one repeat)."""

    runs: list[dict[str, Any]]
    hardware: HardwareSpec
    steps: list[StepRecord]
    step_costs: list[dict[str, Any]]  # bytes and FLOPs of each of `steps`
    request_rows: list[dict[str, Any]]


def peak_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def repeat_metrics(point: ScenarioPoint, loaded: LoadedPoint, engine: Engine, out: RunOutput,
                   hw: HardwareSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One repeat's metrics (latencies, throughput, goodput, MoE routing, stage traffic) and
    the bytes and FLOPs of each of its steps."""
    m = metrics_mod.summarize(
        out.requests, out.steps, out.wall_s,
        kv_bytes_per_token=engine.kv.bytes_per_token, block_size=point.engine.block_size,
        weight_bytes=loaded.model.weight_bytes, peak_memory_bytes=peak_memory_bytes(loaded.device),
        percentiles=point.measure.percentiles)
    if point.measure.slo is not None:
        m.update(goodput_metrics(metrics_mod.request_rows(out.requests), point.measure.slo,
                                 out.wall_s))
    m["state_bytes_per_seq"] = engine.states.bytes_per_seq if engine.states else 0
    add_window(m, metrics_mod.request_rows(out.requests), out.wall_s, point)  # measure.window
    moe_routing = routing_metrics(out.steps)  # MoE: experts touched vs uniform routing
    if moe_routing is not None:
        m["moe"] = moe_routing
    step_costs = annotate_steps(out.steps, loaded.config, point.dtype, point.quant_config(), hw)
    m.update(stage_traffic(out.steps, step_costs, hw, point.dtype))
    return m, step_costs


def add_same_run_reference(m: dict[str, Any], device: str) -> None:
    """How fast memory streams right now on this (shared) machine, and the repeat's
    figures normalized by it."""
    ref = calibrate.measure_reference_bandwidth(device, seconds=0.3)  # read per call: tests fake it
    m["reference_bytes_per_s"] = ref
    m["normalized"] = {
        "output_tokens_per_s_per_gbs": m["output_tokens_per_s"] / (ref / 1e9),
        "decode_bytes_per_s_over_reference": (
            m["decode"]["achieved_bytes_per_s"] / ref if "decode" in m else None),
    }


def add_torch_reference(m: dict[str, Any], bracket: ReferenceBracket) -> None:
    """The torch reference's tokens/s around the repeat, and the repeat's over it."""
    m["torch_reference"] = bracket.after_repeat()
    m["normalized"]["output_tokens_per_s_over_torch_reference"] = (
        m["output_tokens_per_s"] / m["torch_reference"]["output_tokens_per_s"])


def speculative_baseline(point: ScenarioPoint, spec: SpeculativeConfig, engine: Engine,
                         plan: RequestPlan, out: RunOutput,
                         m: dict[str, Any]) -> dict[str, Any]:
    """`metrics.speculative` of a repeat: its acceptance and its speedup over the same
    workload decoded plainly, right after (speedup_measured's baseline)."""
    base = _plain_run(engine, plan, realtime=plan.is_realtime)
    base_m = metrics_mod.from_request_rows(
        metrics_mod.request_rows(base.requests), point.measure.percentiles, base.wall_s)
    accepted = spec_mod.acceptance(out.steps)
    return {"method": spec.label, "num_tokens": spec.num_tokens, **accepted,
            **spec_mod.compare(accepted, m, base_m, spec_mod.plain_decode_step_s(base.steps))}


def measure_repeats(point: ScenarioPoint, loaded: LoadedPoint, engine: Engine,
                    plan: RequestPlan, reference: SameRunReference | None,
                    on_step: Callable[[StepRecord], None] | None, phase: Phase) -> Measured:
    """measure.repeats timed passes, each with its references and speculative baseline."""
    hw = resolve_hardware(point.hardware, loaded.device)  # `auto`: this machine, probed once
    spec = speculation(point)
    bracket = ReferenceBracket(reference, phase) if reference is not None else None
    runs: list[dict[str, Any]] = []
    last: tuple[RunOutput, list[dict[str, Any]]] | None = None
    for i in range(point.measure.repeats):
        phase(f"repeat {i + 1}/{point.measure.repeats}")
        out = plan.run(engine, plan.is_realtime, on_step)
        m, step_costs = repeat_metrics(point, loaded, engine, out, hw)
        if plan.conversations is not None:  # per turn index and per session
            m.update(sessions_metrics(tag_rows(metrics_mod.request_rows(out.requests)),
                                      plan.conversations, out.wall_s,
                                      point.measure.percentiles))
        add_same_run_reference(m, loaded.device)
        if bracket is not None:
            add_torch_reference(m, bracket)
        if spec is not None:
            phase(f"repeat {i + 1}/{point.measure.repeats}: plain baseline")
            m["speculative"] = speculative_baseline(point, spec, engine, plan, out, m)
        runs.append(m)
        last = out, step_costs
    assert last is not None  # measure.repeats is at least 1 (the schema's PosInt)
    out, step_costs = last
    sent = len({r.request_id.split("/")[0] for r in out.requests})
    short = duration_note(point, sent, len(plan.requests))
    if short is not None:
        note(point, short)
    rows = metrics_mod.request_rows(out.requests)
    return Measured(runs, hw, out.steps, step_costs,
                    tag_rows(rows) if plan.conversations is not None else rows)


# ---- accuracy, telemetry -------------------------------------------------------------------
def measure_accuracy(point: ScenarioPoint, loaded: LoadedPoint, engine: Engine,
                     cache: ModelCache, phase: Phase) -> accuracy_mod.Accuracy | None:
    """The point's accuracy on the engine's backend, after the timed repeats (which it must
    not disturb); None when the point measures none."""
    plan = loaded.eval_plan
    if plan is None:
        return None
    phase(f"accuracy ({plan.tokens} tokens)")
    return accuracy_mod.point_accuracy(
        point, loaded.model, plan, loaded.key, backend=engine.ops.name, memo=cache.accuracy,
        load_reference=lambda: _load_model(point, loaded.device))


def start_nvml(device: str) -> NvmlSampler | None:
    """NVML samples of the GPU over the warm-up and the repeats; None on a CPU."""
    return NvmlSampler(torch.cuda.current_device()).start() if device == "cuda" else None


def stop_nvml(sampler: NvmlSampler | None) -> dict[str, Any]:
    """The result's `telemetry` so far: {"nvml": ...} from a GPU's sampler."""
    return {"nvml": sampler.stop()} if sampler is not None else {}


def profile_ncu(point: ScenarioPoint, device: str, phase: Phase) -> dict[str, Any]:
    """{"ncu": ...} with measure.profile ncu (skipped off CUDA); else nothing."""
    if point.measure.profile != "ncu":
        return {}
    phase("profiling decode steps under ncu")
    if device != "cuda":
        return {"ncu": {"status": "skipped: ncu profiles CUDA kernels; device is cpu"}}
    return {"ncu": ncu_profile(point.to_dict())}


# ---- summarize and predict, assemble the result --------------------------------------------
@dataclass(frozen=True)
class Summary:
    """The repeats aggregated (median, with its noise figures) and the prediction beside."""

    metrics: dict[str, Any]
    spread: dict[str, Any]
    prediction: dict[str, Any]


def summarize(point: ScenarioPoint, loaded: LoadedPoint, measured: Measured,
              said: set[str], requests: list[Request] | None = None,
              conversations: list[Conversation] | None = None) -> Summary:
    """The median of the repeats, their noise and the prediction for the point (the roofline
    and the simulation of the `requests`, or a sessions point's `conversations`, it
    served); a note for each noise warning and for each flag of a doubtful hardware
    profile."""
    hw = measured.hardware
    metrics, spread = metrics_mod.aggregate_repeats(measured.runs)
    for key in ("by_turn", "sessions"):  # sessions: of the last repeat, like its rows
        if key in measured.runs[-1]:
            metrics[key] = measured.runs[-1][key]
    metrics["noise"] = metrics_mod.noise(
        measured.runs, reference_bytes_per_s=metrics.get("reference_bytes_per_s"),
        hardware_bandwidth=hw.bandwidth, hardware_name=hw.name)
    for warning in metrics["noise"]["warnings"]:
        note(point, warning)
    tok = loaded.model.tokenizer
    prediction = predict_point(point, loaded.config, hw, requests=requests,
                               conversations=conversations, tokenizer=tok,
                               eos_token_id=tok.eos_token_id if tok is not None else None)
    for flag in prediction.get("profile_flags") or []:  # a doubtful profile: never silent
        text = (f"note: predictions on the flagged profile {hw.name!r} (each result records "
                f"it in prediction.profile_flags): {flag}")
        if text not in said:  # the profile's flag, not the point's: once per run
            said.add(text)
            print(text, file=sys.stderr)
    return Summary(metrics, spread, prediction)


def point_env(point: ScenarioPoint, loaded: LoadedPoint, engine: Engine,
              slowdown: float) -> dict[str, Any]:
    """The result's `env`: the machine's, then what this point ran on and how."""
    env = results_mod.env_info(loaded.device)
    env["backend"] = engine.ops.name
    env["dtype_choice"] = point.dtype_reason or f"dtype {point.dtype} (set by the scenario)"
    env["kv_budget_bytes"] = engine.kv_budget_bytes
    env["kv_num_blocks"] = engine.kv.num_blocks
    env["model_source"] = point.model_source()
    env["model_weights"] = loaded.model.weights  # "real: FILE" or "random (seed N)"
    if slowdown:
        env["test_slowdown"] = slowdown  # never silent: a result with it is not a measurement
    return env


def assemble_result(point: ScenarioPoint, loaded: LoadedPoint, engine: Engine,
                    measured: Measured, summary: Summary, *, telemetry: dict[str, Any],
                    accuracy: accuracy_mod.Accuracy | None, slowdown: float,
                    prefix: dict[str, Any] | None = None) -> dict[str, Any]:
    """The point's self-describing result (results.store.build_result); `prefix` is the
    plan's prefix groups, recorded beside the engine's measured hit rate."""
    steps = [{**dataclasses.asdict(s), **c}
             for s, c in zip(measured.steps, measured.step_costs, strict=True)]
    scenario = point.to_dict()  # model.weights: real | random (the path is this machine's)
    return results_mod.build_result(
        scenario, metrics=summary.metrics, prediction=summary.prediction, steps=steps,
        env=point_env(point, loaded, engine, slowdown), seed=point.workload.seed,
        hardware=measured.hardware.to_dict(), repeats=measured.runs, spread=summary.spread,
        extra={"model_config": dataclasses.asdict(loaded.config), "telemetry": telemetry,
               "requests": measured.request_rows,
               # what the scenario asked for but this model ran without (never silent)
               "engine_disabled": list(engine.disabled),
               **({"accuracy": accuracy.to_dict()} if accuracy is not None else {}),
               **({"prefix": with_measured(prefix, summary.metrics, telemetry)}
                  if prefix is not None else {})},
    )
