"""One `decoding: {kind: diffusion}` scenario point: measured, priced, and written as a result.

`bench.run_point` hands such points here.  The workload is `batch_size` seeded random
prompts of `prompt_len` tokens, all decoded together (`engine/diffusion.py`) into `gen_len`
tokens in `decoding.steps` steps; each repeat is timed end to end and per step.  Every step
is accounted with the analytic model's counting rules (`roofline/diffusion.py`) so that its
FLOPs, bytes, arithmetic intensity, MBU and MFU land on the same roofline as the
prediction, and the result carries the autoregressive prediction of the same model next
to it.  The result is the version 2 schema with its optional diffusion fields
(`metrics.diffusion`, `prediction.diffusion`, `diffusion`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.device import resolve_device
from infbench.core.errors import UserError
from infbench.hardware.spec import HardwareSpec
from infbench.measure.model_cache import ModelCache
from infbench.scenario.point import ScenarioPoint

if TYPE_CHECKING:  # torch: imported where a diffusion point runs
    from infbench.engine.diffusion import DiffusionStep
    from infbench.model.diffusion import DiffusionLM


def _load(point: ScenarioPoint, dev: str,
          cache: ModelCache) -> tuple[DiffusionLM, str, str, int]:
    """(DiffusionLM, source label, weights label, weight bytes) of the point's model."""
    from infbench.checkpoint.llada import is_llada_dir
    from infbench.model.diffusion import DiffusionLM, load_llada
    from infbench.model.loader import load_model
    from infbench.model.quant import stored_weight_bytes

    source = point.model_source()
    assert point.decoding is not None and point.model is not None  # a diffusion point
    mask = point.decoding.mask_token_id
    weights = point.model.weights
    seed = point.workload.seed
    if "path" in source and is_llada_dir(source["path"]):
        key = repr(("llada", source, point.dtype, dev, mask))
        lm = cache.get(key, lambda: load_llada(source["path"], point.dtype, dev, mask))
        return lm, lm.source, f"real: {source['path']}", stored_weight_bytes(lm.model)
    overrides = point.model.changes()
    key = repr((sorted(source.items()), sorted(overrides.items(), key=str), point.dtype, dev,
                weights))
    loaded = cache.get(key, lambda: load_model(source, dtype=point.dtype, device=dev, seed=seed,
                                               overrides=overrides, weights=weights))
    assert mask is not None  # DecodingSection.resolved: only a LLaDA directory has its own
    lm = DiffusionLM(loaded.model.eval(), loaded.config, mask, loaded.source)
    return lm, loaded.source, loaded.weights, loaded.weight_bytes


def _peak_memory_bytes(device: str) -> int:
    import resource

    import torch

    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _step_rows(steps: list[DiffusionStep], cfg: ModelConfig, batch: int, point: ScenarioPoint,
               hw: HardwareSpec, quant: QuantConfig) -> list[dict[str, Any]]:
    """The stored step rows: shape, time and the counting rules' FLOPs and bytes."""
    from infbench.roofline.diffusion import DiffusionStepShape, diffusion_step_costs
    from infbench.roofline.ops import total

    rows, start = [], 0.0
    priced: dict[tuple[int, int, int], Any] = {}
    for i, s in enumerate(steps):
        key = (s.query_len, s.context_len, s.num_logits)
        if key not in priced:
            shape = DiffusionStepShape(*key, count=1)
            priced[key] = total(diffusion_step_costs(cfg, shape, batch, point.dtype, quant))
        cost = priced[key]
        dur = max(s.time_s, 1e-12)
        rows.append({
            "index": i, "start_s": start, "duration_s": s.time_s, "stage": "diffusion",
            "query_lens": [s.query_len] * batch, "context_lens": [s.context_len] * batch,
            "logits_lens": [s.num_logits] * batch, "num_prefill_tokens": 0,
            "num_decode_tokens": s.committed * batch, "flops": cost.flops, "bytes": cost.bytes,
            "weight_bytes_read": cost.weight_bytes, "intensity": cost.intensity,
            "achieved_flops_per_s": cost.flops / dur, "achieved_bytes_per_s": cost.bytes / dur,
            "mbu": cost.bytes / dur / hw.bandwidth,
            "mfu": cost.flops / dur / hw.peak_at(point.dtype, batch * s.query_len),
        })
        start += s.time_s
    return rows


def _repeat_metrics(rows: list[dict[str, Any]], wall_s: float, point: ScenarioPoint,
                    hw: HardwareSpec, weight_bytes: int, peak_bytes: int) -> dict[str, Any]:
    from infbench.measure import metrics as metrics_mod

    wl = point.workload
    tokens = wl.batch_size * wl.gen_len
    flops = sum(r["flops"] for r in rows)
    nbytes = sum(r["bytes"] for r in rows)
    step_s = sum(r["duration_s"] for r in rows)
    e2e = metrics_mod.latency_stats([wall_s] * wl.batch_size, point.measure.percentiles)
    return {
        "e2e_s": e2e, "output_tokens_per_s": tokens / wall_s,
        "total_tokens_per_s": wl.batch_size * (wl.prompt_len + wl.gen_len) / wall_s,
        "requests_per_s": wl.batch_size / wall_s, "weight_bytes": weight_bytes,
        "peak_memory_bytes": peak_bytes, "num_requests": wl.batch_size,
        "num_prompt_tokens": wl.batch_size * wl.prompt_len, "num_output_tokens": tokens,
        "num_steps": len(rows), "wall_s": wall_s,
        "diffusion": {
            "flops": flops, "bytes": nbytes, "time_s": step_s, "num_steps": len(rows),
            "num_tokens": tokens, "intensity": flops / nbytes,
            "achieved_flops_per_s": flops / step_s, "achieved_bytes_per_s": nbytes / step_s,
            "mbu": nbytes / step_s / hw.bandwidth,
            "mfu": flops / step_s / hw.peak_at(point.dtype, None),
            "time_per_token_s": wall_s / wl.gen_len,
        },
    }


def _prediction(point: ScenarioPoint, cfg: ModelConfig, hw: HardwareSpec,
                quant: QuantConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    from infbench.roofline.diffusion import diffusion_dict, predict_diffusion

    d, wl = point.decoding, point.workload
    assert d is not None  # a diffusion point
    p = predict_diffusion(cfg, hw, batch=wl.batch_size, prompt_len=wl.prompt_len,
                          gen_len=wl.gen_len, steps=d.steps, block_length=d.block_length,
                          prefix_cache=d.prefix_cache, dtype=point.dtype, quant=quant)
    flops = sum(s.cost.flops * s.shape.count for s in p.step_prices) / p.steps
    nbytes = sum(s.cost.bytes * s.shape.count for s in p.step_prices) / p.steps
    bounds = {s.bound for s in p.step_prices}
    # one mean step, like the decode stage (the whole decode is e2e_s)
    stage = {"flops": flops, "bytes": nbytes, "intensity": p.intensity,
             "time_s": p.mean_step_time_s, "step_time_s": p.mean_step_time_s,
             "tokens_per_s": p.tokens_per_s, "bound": bounds.pop() if len(bounds) == 1
             else "mixed"}
    pred = {"model": cfg.name, "hardware": hw.name, "dtype": point.dtype, "quant": None,
            "batch": wl.batch_size, "prompt_len": wl.prompt_len, "gen_len": wl.gen_len,
            "e2e_s": p.total_time_s, "output_tokens_per_s": p.tokens_per_s,
            "diffusion": stage,
            "note": (f"masked diffusion: {p.steps} steps for {wl.gen_len} tokens; the same "
                     f"model autoregressively: {p.ar_tokens_per_s:.4g} tokens/s predicted")}
    return pred, diffusion_dict(p)


def run_diffusion_point(point: ScenarioPoint, *, cache: ModelCache, device: str | None = None,
                        on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure one diffusion point and return its result dict (`bench.run_point`'s shape)."""
    import torch

    from infbench.engine.diffusion import DiffusionPlan, diffusion_generate
    from infbench.measure import metrics as metrics_mod
    from infbench.measure.machine import resolve_hardware
    from infbench.results import store as results_mod

    phase = on_phase or (lambda _msg: None)
    if point.workload.kind != "static":
        raise UserError(f"{point.source}: decoding.kind diffusion runs workload.kind static "
                        f"(one batch decoded together), got {point.workload.kind}")
    quant = point.quant_config()
    if quant.weights != "none" or quant.kv != "none":
        raise UserError(f"{point.source}: model.quant is not supported with decoding.kind "
                        "diffusion; allowed: weights none, kv none")
    dev = resolve_device(device or point.device)
    if point.engine.num_threads is not None:
        torch.set_num_threads(point.engine.num_threads)
    phase("loading model")
    lm, source_label, weights_label, weight_bytes = _load(point, dev, cache)
    cfg, wl, d = lm.config, point.workload, point.decoding
    assert d is not None  # a diffusion point
    plan = DiffusionPlan(wl.gen_len, d.steps, d.block_length)
    gen = torch.Generator().manual_seed(wl.seed)
    prompts = torch.randint(0, cfg.vocab_size - 1, (wl.batch_size, wl.prompt_len), generator=gen)
    prompts[prompts >= lm.mask_token_id] += 1  # never the mask token itself
    kw = dict(remasking=d.remasking, prefix_cache=d.prefix_cache, seed=wl.seed)
    for i in range(point.measure.warmup):
        phase(f"warm-up {i + 1}/{point.measure.warmup}")
        diffusion_generate(lm, prompts, plan, **kw)  # type: ignore[arg-type]
    hw = resolve_hardware(point.hardware, dev)  # `auto`: this machine, probed once
    runs, rows = [], []
    out = None
    for i in range(point.measure.repeats):
        phase(f"repeat {i + 1}/{point.measure.repeats}")
        out = diffusion_generate(lm, prompts, plan, **kw)  # type: ignore[arg-type]
        rows = _step_rows(out.steps, cfg, wl.batch_size, point, hw, quant)
        runs.append(_repeat_metrics(rows, out.wall_s, point, hw, weight_bytes,
                                    _peak_memory_bytes(dev)))
    assert out is not None  # measure.repeats >= 1 (the schema)
    summary, spread = metrics_mod.aggregate_repeats(runs)
    summary["noise"] = metrics_mod.noise(runs, hardware_bandwidth=hw.bandwidth,
                                         hardware_name=hw.name)
    for warning in summary["noise"]["warnings"]:
        print(f"note: {point.name} point {point.index} ({point.label}): {warning}",
              file=sys.stderr)
    prediction, detail = _prediction(point, cfg, hw, quant)
    env = results_mod.env_info(dev)
    env.update(backend="torch", model_source=point.model_source(), model_weights=weights_label,
               dtype_choice=point.dtype_reason or f"dtype {point.dtype} (set by the scenario)")
    requests = [{"id": f"diffusion-{b}", "arrival_s": 0.0, "first_token_s": None,
                 "finish_s": out.wall_s, "num_prompt_tokens": wl.prompt_len,
                 "num_output_tokens": wl.gen_len, "finish_reason": "length"}
                for b in range(wl.batch_size)]
    return results_mod.build_result(
        point.to_dict(), metrics=summary, prediction=prediction, steps=rows, env=env,
        seed=wl.seed, hardware=hw.to_dict(), repeats=runs, spread=spread,
        extra={"model_config": dataclasses.asdict(cfg), "requests": requests,
               "diffusion": {**d.to_dict(), "mask_token_id": lm.mask_token_id,
                             "source": source_label, "analytic": detail,
                             "sample_tokens": out.tokens[0].tolist()}},
    )
