"""Run one scenario point end to end: model + engine + workload -> metrics + prediction.

The CLI's `infbench run` calls `run_point` for every sweep point; tests and CI
jobs call it too.  `run_point` is the list of an engine point's stages, each a function
of `measure/engine_point.py`; a masked-diffusion point runs `measure/diffusion_point.py`'s
loop instead.  Loaded models are cached across points that share the same weights
(`ModelCache`), so a batch-size sweep loads SmolLM2 once.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from infbench.core.device import resolve_device
from infbench.core.errors import UserError
from infbench.engine.records import StepRecord
from infbench.measure.model_cache import ModelCache
from infbench.measure.workload import client_concurrency
from infbench.scenario.point import ScenarioPoint

__all__ = ["SLOWDOWN_ENV", "ModelCache", "client_concurrency", "injected_slowdown", "run_point",
           "slowed_down"]


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


def run_point(point: ScenarioPoint, *, cache: ModelCache | None = None,
              device: str | None = None, on_step: Callable[[StepRecord], None] | None = None,
              on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure one ScenarioPoint and return its self-describing result dict."""
    cache = cache or ModelCache()
    if point.decoding is not None:  # masked diffusion: its own loop
        from infbench.measure.diffusion_point import run_diffusion_point  # torch: as below

        return run_diffusion_point(point, cache=cache, device=device, on_phase=on_phase)
    # torch, the engine and the model, imported only when an engine point runs: a run
    # against a server (client/point.py) loads none of them.
    from infbench.measure import engine_point as stage

    phase = on_phase or (lambda _msg: None)
    dev = resolve_device(device or point.device)
    stage.refuse_kv_quant(point, dev)  # the device, before the model is loaded
    slowdown = injected_slowdown()
    if slowdown:
        stage.note(point, f"{SLOWDOWN_ENV}={slowdown:g}: every engine step is padded so "
                   "tokens/s drop by that fraction (a test of the gate, not a measurement)")
    loaded = stage.load(point, dev, cache, phase)
    plan = stage.plan_requests(point, loaded, client_concurrency(point.workload))
    reference = stage.torch_reference(point, loaded, plan)  # before the engine (its KV budget)
    engine = stage.start_engine(point, loaded, plan)
    nvml = stage.start_nvml(dev)
    stage.warm_up(point, engine, plan, phase)
    step_hook = slowed_down(on_step, slowdown) if slowdown else on_step
    measured = stage.measure_repeats(point, loaded, engine, plan, reference, step_hook, phase)
    telemetry = stage.stop_nvml(nvml)
    accuracy = stage.measure_accuracy(point, loaded, engine, cache, phase)
    telemetry.update(stage.profile_ncu(point, dev, phase))
    summary = stage.summarize(point, loaded, measured, cache.said, plan.requests,
                              plan.conversations)
    return stage.assemble_result(point, loaded, engine, measured, summary, telemetry=telemetry,
                                 accuracy=accuracy, slowdown=slowdown, prefix=plan.prefix)
