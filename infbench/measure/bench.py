"""Run one scenario point end to end: model + engine + workload -> metrics + prediction.

The CLI's `infbench run` calls `run_point` for every sweep point; tests and CI
jobs call it too.  Loaded models are cached across points that share the same
weights, so a batch-size sweep loads SmolLM2 once.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infbench.core.device import resolve_device
from infbench.core.errors import UserError
from infbench.engine.records import StepRecord


@dataclass
class ModelCache:
    """Loaded models keyed by (source, overrides, dtype, device)."""

    entries: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, load: Callable[[], Any]) -> Any:
        if key not in self.entries:
            self.entries.clear()  # keep one model resident: sweeps are ordered by point
            self.entries[key] = load()
        return self.entries[key]


def model_overrides(model: dict[str, Any]) -> dict[str, Any]:
    over = dict(model.get("overrides") or {})
    if model.get("attention"):
        over["attention"] = dict(model["attention"])
    return over


def peak_memory_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def run_point(point: Any, *, cache: ModelCache | None = None, device: str | None = None,
              on_step: Callable[[StepRecord], None] | None = None,
              on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure one ScenarioPoint and return its self-describing result dict."""
    import torch

    from infbench.core.hardware import get_hardware
    from infbench.engine.engine import Engine, KVSizing
    from infbench.measure import metrics as metrics_mod
    from infbench.measure.calibrate import measure_reference_bandwidth
    from infbench.measure.prediction import predict_point
    from infbench.measure.traffic import annotate_steps, stage_traffic
    from infbench.measure.workload import generate_requests
    from infbench.model.loader import load_model
    from infbench.results import store as results_mod

    cache = cache or ModelCache()
    dev = resolve_device(device or point.device)
    if point.quant_config().weights != "none":
        raise UserError(
            f"{point.name}: model.quant.weights={point.quant_config().weights!r} is predicted by "
            "`infbench predict` but the engine runs unquantized weights for now; allowed in "
            "`infbench run`: none")
    if point.speculative.method != "none":
        raise UserError(
            f"{point.source}: speculative.method={point.speculative.method!r} is priced by "
            "`infbench predict`, but the engine has no speculative decoding yet; allowed in "
            "`infbench run`: none")
    source = point.model_source()
    overrides = model_overrides(point.model)
    seed = point.workload.seed
    weights = point.model.get("weights", "auto")  # auto | random (model.weights)
    key = repr((sorted(source.items()), sorted(overrides.items(), key=str), point.dtype, dev,
                weights))
    phase = on_phase or (lambda _msg: None)
    phase("loading model")
    loaded = cache.get(key, lambda: load_model(source, dtype=point.dtype, device=dev, seed=seed,
                                               overrides=overrides, weights=weights))
    cfg = loaded.config
    tok = loaded.tokenizer
    eos = tok.eos_token_id if tok is not None else None
    requests = generate_requests(point.workload, cfg.vocab_size, tokenizer=tok, eos_token_id=eos)
    engine_cfg = point.engine
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings():  # reported below, once per point, from engine.disabled
        warnings.filterwarnings("ignore", message="engine.cuda_graphs ignored")
        engine = Engine.create(loaded, engine_cfg, dev, point.dtype, seed=seed,
                               sizing=KVSizing.for_requests(requests, engine_cfg.block_size))
    for item in engine.disabled:
        print(f"note: {point.name} point {point.index} ({point.label}): engine.{item['feature']} "
              f"is off for this model: {item['reason']}", file=sys.stderr)
    realtime = point.workload.kind == "poisson"
    telemetry: dict[str, Any] = {}
    sampler = None
    if dev == "cuda":
        from infbench.measure.telemetry import NvmlSampler

        sampler = NvmlSampler(torch.cuda.current_device()).start()
    for i in range(point.measure.warmup):
        phase(f"warm-up {i + 1}/{point.measure.warmup}")
        engine.run(requests, realtime_arrivals=False)
    hw = get_hardware(point.hardware)
    runs: list[dict[str, Any]] = []
    last_steps: list[StepRecord] = []
    for i in range(point.measure.repeats):
        phase(f"repeat {i + 1}/{point.measure.repeats}")
        out = engine.run(requests, realtime_arrivals=realtime, on_step=on_step)
        m = metrics_mod.summarize(
            out.requests, out.steps, out.wall_s,
            kv_bytes_per_token=engine.kv.bytes_per_token, block_size=engine_cfg.block_size,
            weight_bytes=loaded.weight_bytes, peak_memory_bytes=peak_memory_bytes(dev),
            percentiles=point.measure.percentiles)
        m["state_bytes_per_seq"] = engine.states.bytes_per_seq if engine.states else 0
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
        runs.append(m)
        # The stored steps and per-request rows both come from the last repeat.
        last_steps, last_costs = out.steps, step_costs
        last_rows = metrics_mod.request_rows(out.requests)
    if sampler is not None:
        telemetry["nvml"] = sampler.stop()
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
    steps = [{**dataclasses.asdict(s), **c} for s, c in zip(last_steps, last_costs, strict=True)]
    env = results_mod.env_info(dev)
    env["backend"] = engine.ops.name
    env["dtype_choice"] = point.dtype_reason or f"dtype {point.dtype} (set by the scenario)"
    env["kv_budget_bytes"] = engine.kv_budget_bytes
    env["kv_num_blocks"] = engine.kv.num_blocks
    env["model_source"] = source
    env["model_weights"] = loaded.weights  # "real: FILE" or "random (seed N)": this machine's
    scenario = point.to_dict()  # model.weights: real | random (the path is this machine's)
    return results_mod.build_result(
        scenario, metrics=summary, prediction=prediction, steps=steps, env=env,
        seed=seed, hardware=hw.to_dict(), repeats=runs, spread=spread,
        extra={"model_config": dataclasses.asdict(cfg), "telemetry": telemetry,
               "requests": last_rows,
               # what the scenario asked for but this model ran without (never silent)
               "engine_disabled": list(engine.disabled)},
    )

