"""Run one scenario point end to end: model + engine + workload -> metrics + prediction.

The CLI's `infbench run` calls `run_point` for every sweep point; tests and CI
jobs call it too.  Loaded models are cached across points that share the same
weights, so a batch-size sweep loads SmolLM2 once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infbench.core.device import resolve_device
from infbench.core.errors import ConfigError, UserError
from infbench.engine.records import StepRecord

if TYPE_CHECKING:
    from infbench.measure.torch_reference import SameRunReference


@dataclass
class ModelCache:
    """Loaded models keyed by (source, overrides, dtype, device); `accuracy` keeps the
    accuracy figures of every model measured in the run (measure/accuracy.py)."""

    entries: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        if key not in self.entries:
            self.entries.clear()  # keep one model resident: sweeps are ordered by point
            self.entries[key] = load()
        return self.entries[key]


def peak_memory_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


# Test-only: a fraction f in [0, 1) pads every measured engine step so that tokens/s drop
# by f (docs/gate.md shows the gate failing on it).  Recorded in the result's env.
SLOWDOWN_ENV = "INFBENCH_TEST_SLOWDOWN"


def injected_slowdown() -> float:
    """The fraction from INFBENCH_TEST_SLOWDOWN; 0 when unset or empty."""
    raw = os.environ.get(SLOWDOWN_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        fraction = float(raw)
    except ValueError:
        fraction = math.nan
    if not 0 <= fraction < 1:  # NaN fails too
        raise UserError(f"{SLOWDOWN_ENV}={raw!r}: must be a fraction in [0, 1) (0.15 slows the "
                        "engine's tokens/s by 15%, for testing the gate); unset it to measure")
    return fraction


def slowed_down(on_step: Callable[[StepRecord], None] | None,
                fraction: float) -> Callable[[StepRecord], None]:
    """An on_step hook that burns fraction / (1 - fraction) of each step's CPU time.

    The hook runs inside Engine.run's timed loop, so the run takes that much longer: as if
    the engine's own code had become slower.  It spins on the calling thread's CPU clock
    (the host thread's CPU time since the previous hook), not on the wall clock: on a
    loaded machine a sleep or a wall-clock spin loses whole scheduler time slices at its
    end (measured: 0.15 became 0.3), while extra work stretches with the load as the
    step's own work does.
    """
    extra = fraction / (1 - fraction)
    last = time.thread_time()

    def hook(record: StepRecord) -> None:
        nonlocal last
        now = time.thread_time()
        if record.index == 0:  # a new run: the CPU clock since the last hook spans more
            last = now - min(record.duration_s, now - last)
        until = now + (now - last) * extra
        while time.thread_time() < until:
            pass
        last = time.thread_time()
        if on_step is not None:
            on_step(record)

    return hook


def build_torch_reference(point: Any, cfg: Any, device: str,
                          requests: list[Any]) -> SameRunReference:
    """The plain-torch reference of `point` (measure.torch_reference), or a UserError."""
    from infbench.measure.torch_reference import (
        SUPPORTED_ATTENTION,
        ReferencePlan,
        SameRunReference,
        TorchReference,
        unsupported_reason,
    )
    from infbench.model.dtypes import TORCH_DTYPES

    reason = unsupported_reason(cfg)
    if reason is not None:
        raise UserError(f"measure.torch_reference: the plain-torch reference does not run "
                        f"{reason}; it runs Llama-family models with attention.kind "
                        f"{', '.join(SUPPORTED_ATTENTION)} (set measure.torch_reference: false "
                        "and gate on another normalize mode)")
    reference = TorchReference(cfg, TORCH_DTYPES[point.dtype], device, seed=point.workload.seed)
    plan = ReferencePlan.for_requests(requests, point.engine.max_num_seqs)
    return SameRunReference(reference, plan, seed=point.workload.seed)


def client_concurrency(workload: Any) -> int | None:
    """The client-side cap on outstanding requests: workload.max_concurrency, or for kind
    static batch_size (num_requests run batch_size at a time); None: no cap."""
    if workload.kind == "static":
        return workload.batch_size if workload.num_prompts > workload.batch_size else None
    return workload.max_concurrency


def run_point(point: Any, *, cache: ModelCache | None = None, device: str | None = None,
              on_step: Callable[[StepRecord], None] | None = None,
              on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure one ScenarioPoint and return its self-describing result dict."""
    if getattr(point, "decoding", None) is not None:  # masked diffusion: its own loop
        from infbench.measure.diffusion_point import run_diffusion_point

        return run_diffusion_point(point, cache=cache or ModelCache(), device=device,
                                   on_phase=on_phase)
    import torch

    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.kv_cache import kv_quant_refusal
    from infbench.measure import accuracy as accuracy_mod
    from infbench.measure import metrics as metrics_mod
    from infbench.measure import speculative as spec_mod
    from infbench.measure.calibrate import measure_reference_bandwidth
    from infbench.measure.goodput import goodput_metrics
    from infbench.measure.machine import resolve_hardware
    from infbench.measure.moe_routing import routing_metrics
    from infbench.measure.prediction import predict_point
    from infbench.measure.traffic import annotate_steps, stage_traffic
    from infbench.measure.workload import generate_requests
    from infbench.model.loader import load_model
    from infbench.results import store as results_mod

    cache = cache or ModelCache()
    dev = resolve_device(device or point.device)
    quant = point.quant_config()

    def refuse_kv_quant(cfg: Any = None) -> None:
        """model.quant.kv the device (or, given cfg, the model) cannot run: one line."""
        reason = kv_quant_refusal(quant.kv, torch.device(dev), cfg)
        if reason is not None:
            raise UserError(f"{point.source}: model.quant.kv={quant.kv!r}: {reason}")

    refuse_kv_quant()  # the device, before the model is loaded
    spec = point.speculative if point.speculative.enabled else None
    slowdown = injected_slowdown()
    if slowdown:
        print(f"note: {point.name} point {point.index} ({point.label}): {SLOWDOWN_ENV}="
              f"{slowdown:g}: every engine step is padded so tokens/s drop by that fraction "
              "(a test of the gate, not a measurement)", file=sys.stderr)
    source = point.model_source()
    assert point.model is not None  # an engine point has a model section
    overrides = point.model.changes()
    seed = point.workload.seed
    weights = point.model.weights  # real | random (model.weights, resolved)
    prune = point.prune_config()
    key = repr((sorted(source.items()), sorted(overrides.items(), key=str), point.dtype, dev,
                weights, quant, prune))
    phase = on_phase or (lambda _msg: None)
    phase("loading model")
    loaded = cache.get(key, lambda: load_model(source, dtype=point.dtype, device=dev, seed=seed,
                                               overrides=overrides, weights=weights,
                                               quant=quant, prune=prune))
    cfg = loaded.config
    eval_plan = accuracy_mod.point_plan(point, loaded)  # None: no accuracy for this point
    refuse_kv_quant(cfg)
    tok = loaded.tokenizer
    eos = tok.eos_token_id if tok is not None else None
    requests = generate_requests(point.workload, cfg.vocab_size, tokenizer=tok, eos_token_id=eos,
                                 max_model_len=cfg.max_seq_len)
    concurrency = client_concurrency(point.workload)
    engine_cfg = point.engine
    # Built before the engine, so a GPU's KV budget already counts its weights.
    reference = (build_torch_reference(point, cfg, dev, requests)
                 if point.measure.torch_reference else None)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings():  # reported below, once per point, from engine.disabled
        warnings.filterwarnings("ignore", message="engine.cuda_graphs ignored")
        try:
            engine = Engine.create(loaded, engine_cfg, dev, point.dtype, seed=seed,
                                   sizing=KVSizing.for_requests(requests, engine_cfg.block_size),
                                   kv_quant=quant.kv, speculative=spec, source=source)
        except ConfigError as exc:
            raise UserError(f"{point.source}: {exc}") from None
    for item in engine.disabled:
        print(f"note: {point.name} point {point.index} ({point.label}): engine.{item['feature']} "
              f"is off for this model: {item['reason']}", file=sys.stderr)
    realtime = point.workload.is_realtime
    telemetry: dict[str, Any] = {}
    sampler = None
    if dev == "cuda":
        from infbench.measure.telemetry import NvmlSampler

        sampler = NvmlSampler(torch.cuda.current_device()).start()
    step_hook = slowed_down(on_step, slowdown) if slowdown else on_step
    for i in range(point.measure.warmup):
        phase(f"warm-up {i + 1}/{point.measure.warmup}")
        engine.run(requests, realtime_arrivals=False, max_concurrency=concurrency)
        if spec is not None:  # the plain baseline is timed too: warm it as well
            engine.set_speculation(False)
            engine.run(requests, realtime_arrivals=False, max_concurrency=concurrency)
            engine.set_speculation(True)
    hw = resolve_hardware(point.hardware, dev)  # `auto`: this machine, probed once
    runs: list[dict[str, Any]] = []
    last_steps: list[StepRecord] = []
    ref_before = None
    if reference is not None:  # warm once, then time the pass before repeat 1
        phase("torch reference")
        reference.time()
        ref_before = reference.time()
    for i in range(point.measure.repeats):
        phase(f"repeat {i + 1}/{point.measure.repeats}")
        out = engine.run(requests, realtime_arrivals=realtime, on_step=step_hook,
                         max_concurrency=concurrency)
        m = metrics_mod.summarize(
            out.requests, out.steps, out.wall_s,
            kv_bytes_per_token=engine.kv.bytes_per_token, block_size=engine_cfg.block_size,
            weight_bytes=loaded.weight_bytes, peak_memory_bytes=peak_memory_bytes(dev),
            percentiles=point.measure.percentiles)
        if point.measure.slo is not None:
            m.update(goodput_metrics(metrics_mod.request_rows(out.requests), point.measure.slo,
                                     out.wall_s))
        m["state_bytes_per_seq"] = engine.states.bytes_per_seq if engine.states else 0
        moe_routing = routing_metrics(out.steps)  # MoE: experts touched vs uniform routing
        if moe_routing is not None:
            m["moe"] = moe_routing
        step_costs = annotate_steps(out.steps, cfg, point.dtype, point.quant_config(), hw)
        m.update(stage_traffic(out.steps, step_costs, hw, point.dtype))
        # Same-run reference: how fast memory streams right now on this (shared) machine.
        ref = measure_reference_bandwidth(dev, seconds=0.3)
        m["reference_bytes_per_s"] = ref
        m["normalized"] = {
            "output_tokens_per_s_per_gbs": m["output_tokens_per_s"] / (ref / 1e9),
            "decode_bytes_per_s_over_reference": (
                m["decode"]["achieved_bytes_per_s"] / ref if "decode" in m else None),
        }
        if reference is not None and ref_before is not None:
            # Bracketed: the passes just before and just after this repeat, so a machine
            # that speeds up or slows down during the run moves both sides alike.
            ref_after = reference.time()
            m["torch_reference"] = reference.bracket(ref_before, ref_after)
            m["normalized"]["output_tokens_per_s_over_torch_reference"] = (
                m["output_tokens_per_s"] / m["torch_reference"]["output_tokens_per_s"])
            ref_before = ref_after
        if spec is not None:
            # The same workload decoded plainly, right after: speedup_measured's baseline.
            phase(f"repeat {i + 1}/{point.measure.repeats}: plain baseline")
            engine.set_speculation(False)
            base = engine.run(requests, realtime_arrivals=realtime, max_concurrency=concurrency)
            engine.set_speculation(True)
            base_m = metrics_mod.from_request_rows(
                metrics_mod.request_rows(base.requests), point.measure.percentiles, base.wall_s)
            accepted = spec_mod.acceptance(out.steps)
            m["speculative"] = {"method": spec.label, "num_tokens": spec.num_tokens, **accepted,
                                **spec_mod.compare(accepted, m, base_m,
                                                   spec_mod.plain_decode_step_s(base.steps))}
        runs.append(m)
        # The stored steps and per-request rows both come from the last repeat.
        last_steps, last_costs = out.steps, step_costs
        last_rows = metrics_mod.request_rows(out.requests)
    if sampler is not None:
        telemetry["nvml"] = sampler.stop()
    accuracy = None
    if eval_plan is not None:  # after the timed repeats, which it must not disturb
        phase(f"accuracy ({eval_plan.tokens} tokens)")
        accuracy = accuracy_mod.point_accuracy(
            point, loaded, eval_plan, key, backend=engine.ops.name, memo=cache.accuracy,
            load_reference=lambda: load_model(source, dtype=point.dtype, device=dev, seed=seed,
                                              overrides=overrides, weights=weights))
    if point.measure.profile == "ncu":
        phase("profiling decode steps under ncu")
        if dev != "cuda":
            telemetry["ncu"] = {"status": "skipped: ncu profiles CUDA kernels; device is cpu"}
        else:
            from infbench.measure.telemetry import ncu_profile

            telemetry["ncu"] = ncu_profile(point.to_dict())
    summary, spread = metrics_mod.aggregate_repeats(runs)
    summary["noise"] = metrics_mod.noise(
        runs, reference_bytes_per_s=summary.get("reference_bytes_per_s"),
        hardware_bandwidth=hw.bandwidth, hardware_name=hw.name)
    for warning in summary["noise"]["warnings"]:
        print(f"note: {point.name} point {point.index} ({point.label}): {warning}",
              file=sys.stderr)
    prediction = predict_point(point, cfg, hw)
    for flag in prediction.get("profile_flags") or []:  # a doubtful profile: never silent
        print(f"note: {point.name} point {point.index} ({point.label}): predicted on the "
              f"flagged profile {hw.name!r}: {flag}", file=sys.stderr)
    steps = [{**dataclasses.asdict(s), **c} for s, c in zip(last_steps, last_costs, strict=True)]
    env = results_mod.env_info(dev)
    env["backend"] = engine.ops.name
    env["dtype_choice"] = point.dtype_reason or f"dtype {point.dtype} (set by the scenario)"
    env["kv_budget_bytes"] = engine.kv_budget_bytes
    env["kv_num_blocks"] = engine.kv.num_blocks
    env["model_source"] = source
    env["model_weights"] = loaded.weights  # "real: FILE" or "random (seed N)": this machine's
    if slowdown:
        env["test_slowdown"] = slowdown  # never silent: a result with it is not a measurement
    scenario = point.to_dict()  # model.weights: real | random (the path is this machine's)
    return results_mod.build_result(
        scenario, metrics=summary, prediction=prediction, steps=steps, env=env,
        seed=seed, hardware=hw.to_dict(), repeats=runs, spread=spread,
        extra={"model_config": dataclasses.asdict(cfg), "telemetry": telemetry,
               "requests": last_rows,
               # what the scenario asked for but this model ran without (never silent)
               "engine_disabled": list(engine.disabled),
               **({"accuracy": accuracy.to_dict()} if accuracy is not None else {})},
    )

