"""Engine-level calibration: matmul efficiency by token count, and per-step overhead.

A datasheet roofline assumes every GEMM runs at peak and a step costs nothing but
its bytes and FLOPs.  On a CPU (and on a GPU without CUDA graphs) neither holds:
a decode GEMM with 16 rows runs at a fraction of the large-GEMM peak, and every
layer pays a fixed dispatch cost.  `infbench calibrate` measures both through the
engine's own code paths and stores them in the profile's `extra`:

- `matmul_flops_by_tokens[dtype]`: [[M, FLOP/s], ...] of the engine's linear layer
  (`split_linear` on CPU, F.linear on GPU) over a stack of weights larger than the
  last-level cache, for M = 1 .. 2048 rows.
- `step_overhead_s`, `layer_overhead_s` and `seq_layer_overhead_s`: fitted to the
  decode step time of tiny-width models (2 and 8 layers at batch 1, 8 layers at batch
  16) whose weights and KV are negligible, so the step time is the engine's fixed
  cost: per step, per layer, and per sequence per layer (attention runs per sequence).

Each matmul point and each of the three step times is a calibrated figure
(`core.calibration_checks.Figure`): a round of repeats, re-measured when it spreads too
far; the matmul rate is the best repeat, a step time the shortest (the least disturbed).

`HardwareSpec.peak_at` and `HardwareSpec.step_overhead_s` read them back; the
analysis uses them only when a profile has them (never for datasheet entries).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from infbench.core.calibration_checks import STEP_FIGURES, Figure, fit_fixed_costs, measure_figure
from infbench.measure.timing import time_op

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048)


def matmul_curve(device: str, dtype: torch.dtype, quick: bool = False) -> dict[int, Figure]:
    """M -> the achieved FLOP/s of the engine's linear path at M rows, as a figure."""
    from infbench.model.linear import split_linear

    dim = 1024 if quick else 2048
    count = 4 if quick else 8  # 8 x 2048^2 fp32 = 128 MB: well past any CPU cache
    weights = [torch.randn(dim, dim, dtype=dtype, device=device) * 0.02 for _ in range(count)]
    linear = split_linear if device == "cpu" else torch.nn.functional.linear
    curve: dict[int, Figure] = {}
    for m in TOKEN_COUNTS[:-2] if quick else TOKEN_COUNTS:
        x = torch.randn(m, dim, dtype=dtype, device=device)

        def run(x: torch.Tensor = x) -> None:
            for w in weights:
                linear(x, w)

        def one_round(run: Any = run, flops: float = 2.0 * m * dim * dim * count
                      ) -> list[float]:
            return [flops / t for t in time_op(run, device, 3 if quick else 5, warmup=1)]

        curve[m] = measure_figure(one_round)
    return curve


def step_time_figures(device: str, quick: bool = False) -> dict[tuple[int, int], Figure]:
    """(layers, batch) -> the median decode step time of one engine run, per repeat, on a
    hidden-64 model (bytes and FLOPs negligible): 2 and 8 layers at batch 1, 8 at batch 16."""
    from infbench.core.config import EngineConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.model.loader import load_model

    gen = 16 if quick else 48
    out = {}
    for layers, batch in STEP_FIGURES:
        loaded = load_model({"preset": "tiny"}, dtype="float32", device=device,
                            overrides={"num_layers": layers})
        reqs = [Request(f"calib{i}", tuple(range(3, 11)),
                        SamplingParams(max_tokens=gen, ignore_eos=True)) for i in range(batch)]
        engine_cfg = EngineConfig()
        engine = Engine.create(loaded, engine_cfg, device, "float32",
                               sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
        engine.run(reqs)  # warm-up

        def one_round(engine: Any = engine, reqs: list[Request] = reqs) -> list[float]:
            return [statistics.median(s.duration_s for s in engine.run(reqs).steps
                                      if s.num_prefill_tokens == 0)
                    for _ in range(2 if quick else 3)]

        out[layers, batch] = measure_figure(one_round, choice="min")
    return out


def step_overhead(device: str, quick: bool = False) -> tuple[float, float, float]:
    """(per-step, per-layer, per-sequence-per-layer) seconds of the engine's decode loop,
    fitted on `step_time_figures`; a fit below zero within noise reads as zero (a fit
    negative beyond it is refused by `check_profile`)."""
    times = step_time_figures(device, quick)
    step, layer, seq = fit_fixed_costs(*(times[k].value for k in STEP_FIGURES))
    return max(0.0, step), max(0.0, layer), max(0.0, seq)


def engine_extra(device: str, dtypes: tuple[str, ...], quick: bool
                 ) -> tuple[dict[str, Any], dict[str, Figure]]:
    """The profile's engine terms, and their figures (`matmul.<dtype>.<M>`,
    `decode_step_s.<layers>x<batch>`)."""
    from infbench.model.dtypes import TORCH_DTYPES

    curves = {d: matmul_curve(device, TORCH_DTYPES[d], quick) for d in dtypes
              if not (device == "cpu" and d != "float32")}  # CPU runs the engine in fp32
    times = step_time_figures(device, quick)
    per_step, per_layer, per_seq = fit_fixed_costs(*(times[k].value for k in STEP_FIGURES))
    figures = {f"matmul.{d}.{m}": fig for d, curve in curves.items() for m, fig in curve.items()}
    figures.update({name: times[k] for k, name in STEP_FIGURES.items()})
    extra = {"matmul_flops_by_tokens": {d: [[float(m), fig.value] for m, fig in curve.items()]
                                        for d, curve in curves.items()},
             # stored clamped at zero; check_profile refuses a fit negative beyond noise
             "step_overhead_s": max(0.0, per_step), "layer_overhead_s": max(0.0, per_layer),
             "seq_layer_overhead_s": max(0.0, per_seq)}
    return extra, figures
