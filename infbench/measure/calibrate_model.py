"""Per-model step calibration: one model's engine steps against the cost model's price of them.

`infbench calibrate` measures the machine through generic kernels: a stack of weight
matrices of assorted widths, attention over two cache shapes, the fixed costs of tiny-width
models.  A real model's step differs from that in ways the generic figures cannot see: its
own matrix shapes (SmolLM2's 576-wide projections and 49k-row LM head run the skinny kernels
at another rate than the stack), its sampling over its vocabulary, its norms and rotary
embedding.  Measured against the simulation's step price, the engine's own decode step of
SmolLM2-135M at batch 1-4 read 1.21-1.27x the price on one machine (docs/
predictions-under-load.md).  Vidur (the published simulator) profiles each model's operators
for this reason.

`infbench calibrate --model M` does the same one level up: it runs the engine on the model
(`measure.bench.run_point`, the code `infbench run` runs) for pure decode steps at batch
1 .. 32 and pure prefill steps of one prompt of 32 .. 512 tokens, prices each measured step
with the simulation's pricer on the profile (`sim.step_cost.make_pricer`, for exactly the
batch the step held), and stores measured / priced by the step's token count in the
profile's `extra.model_steps[KEY]` (KEY: the model source, overrides, dtype and weight
format; `step_key`).  The simulation (`measure.simulation.simulate_point`) multiplies each
step's price by that ratio at the step's token count (linear in log tokens, flat past the
ends), so a mixed step of T prompt tokens and D decodes takes the ratio at T + D: the row
count that sets the matmul regime, as the profile's matmul curve is indexed.

The ratios are relative to the profile's rates, so a new `infbench calibrate` (which rewrites
the profile) drops them; run `calibrate --model` again after it.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from infbench.core.errors import UserError
from infbench.hardware.spec import MODEL_STEPS_KEY
from infbench.measure.model_steps import point_step_key

DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
PREFILL_TOKENS = (32, 64, 128, 256, 512)
DECODE_PROMPT, DECODE_GEN = 32, 16
PREFILL_REQUESTS = 3


def _document(base: dict[str, Any], hardware: str, workload: dict[str, Any],
              max_batched_tokens: int) -> dict[str, Any]:
    doc: dict[str, Any] = {key: base[key] for key in ("device", "dtype", "model", "quant")
                           if key in base}
    engine = dict(base.get("engine") or {})
    engine["max_num_batched_tokens"] = max(int(engine.get("max_num_batched_tokens", 0) or 0),
                                           max_batched_tokens)
    engine["max_num_seqs"] = max(int(engine.get("max_num_seqs", 0) or 0), max(DECODE_BATCHES))
    engine["enable_prefix_caching"] = False  # every prefill step computes its whole prompt
    return {"name": "calibrate_model", "hardware": hardware, **doc, "engine": engine,
            "workload": {"kind": "static", "seed": 0, "ignore_eos": True, **workload},
            "measure": {"warmup": 1, "repeats": 1}}


def _split(step: dict[str, Any]) -> tuple[list[tuple[int, int, int]], list[int]]:
    """A step record's prefill rows (query > 1 or no logits) and decode contexts."""
    prefill, decodes = [], []
    for q, c, n in zip(step["query_lens"], step["context_lens"], step["logits_lens"],
                       strict=True):
        if q > 1 or n == 0:
            prefill.append((int(q), int(c), int(n)))
        else:
            decodes.append(int(c))
    return prefill, decodes


def measure_model_steps(base: dict[str, Any], hardware: str, *, quick: bool = False,
                        log: Callable[[str], None] = lambda _: None) -> tuple[str, dict[str, Any]]:
    """Run the model of scenario document `base` (its device, dtype, model, quant, engine)
    on pure decode and pure prefill steps; returns (key, profile entry)."""
    from infbench.hardware.spec import get_hardware
    from infbench.measure.bench import ModelCache, run_point
    from infbench.scenario.schema import scenario_from_document
    from infbench.sim.step_cost import StepBatch, make_pricer

    check_calibrated(hardware)
    hw = get_hardware(hardware)
    plain = replace(hw, extra={k: v for k, v in hw.extra.items() if k != MODEL_STEPS_KEY})
    batches = DECODE_BATCHES[:4] if quick else DECODE_BATCHES
    prompts = PREFILL_TOKENS[:2] if quick else PREFILL_TOKENS
    gen = DECODE_GEN // 2 if quick else DECODE_GEN
    cache = ModelCache()
    sums: dict[int, list[float]] = {}  # tokens -> [measured s, priced s]
    decode_rows: list[list[float]] = []
    prefill_rows: list[list[float]] = []
    key = ""
    runs = [("decode", b, {"batch_size": b, "num_requests": b, "prompt_len": DECODE_PROMPT,
                           "gen_len": gen}) for b in batches]
    runs += [("prefill", t, {"batch_size": 1, "num_requests": PREFILL_REQUESTS,
                             "prompt_len": t, "gen_len": 2}) for t in prompts]
    pricer = None
    for kind, size, workload in runs:
        doc = _document(base, hardware, workload, max(prompts) + max(batches))
        point = scenario_from_document(doc, "calibrate --model").points()[0]
        cfg = point.model_config()
        if workload["prompt_len"] + workload["gen_len"] > cfg.max_seq_len:
            continue  # a probe longer than the model's context
        if pricer is None:
            key = point_step_key(point)
            pricer = make_pricer(cfg, plain, point.dtype, point.quant_config())
        log(f"{kind} {'batch' if kind == 'decode' else 'prompt'} {size}")
        # run_point's per-point notes (the same-run bandwidth against the profile, ...) are
        # about a measured scenario; these probes are not one, so they are not printed
        with contextlib.redirect_stderr(io.StringIO()):
            result = run_point(point, cache=cache)
        measured = priced = 0.0
        count = 0
        for step in result["steps"]:
            prefill, decodes = _split(step)
            if kind == "decode" and (prefill or len(decodes) != size):
                continue
            if kind == "prefill" and (len(prefill) != 1 or decodes or prefill[0][0] != size):
                continue
            measured += float(step["duration_s"])
            priced += pricer.seconds(StepBatch(prefill, decodes))
            count += 1
        if measured <= 0 or priced <= 0:
            continue
        acc = sums.setdefault(size, [0.0, 0.0])
        acc[0] += measured
        acc[1] += priced
        # one step's mean seconds, measured and priced
        (decode_rows if kind == "decode" else prefill_rows).append(
            [size, measured / count, priced / count])
    if not sums:
        raise UserError("calibrate --model: no pure decode or prefill step was measured "
                        "(the model's context is too short for the probes)")
    entry = {"by_tokens": [[float(n), m / p] for n, (m, p) in sorted(sums.items())],
             "decode": decode_rows, "prefill": prefill_rows,
             "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime()),
             "quick": quick}
    return key, entry


def check_calibrated(hardware: str) -> None:
    """`hardware` must name a saved calibrated profile (`calibrate --name`): the ratios are
    relative to its rates and are written back into it."""
    from infbench.hardware.spec import check_profile_name, profile_path

    check_profile_name(hardware)
    if not profile_path(hardware).is_file():
        raise UserError(f"calibrate --model: --name {hardware!r}: no calibrated profile at "
                        f"{profile_path(hardware)}; run `infbench calibrate --name {hardware}` "
                        "first (the model's steps are priced on it)")


def save_model_steps(hardware: str, key: str, entry: dict[str, Any]) -> Any:
    """Add `entry` under `key` to the calibrated profile `hardware` (written atomically)."""
    from infbench.hardware.spec import get_hardware
    from infbench.measure.calibrate import save_profile

    hw = get_hardware(hardware)
    steps = dict(hw.extra.get(MODEL_STEPS_KEY) or {})
    steps[key] = entry
    return save_profile(replace(hw, extra={**hw.extra, MODEL_STEPS_KEY: steps}), hardware)
