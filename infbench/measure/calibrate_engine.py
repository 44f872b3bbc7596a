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

`HardwareSpec.peak_at` and `HardwareSpec.step_overhead_s` read them back; the
analysis uses them only when a profile has them (never for datasheet entries).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048)


def matmul_curve(device: str, dtype: torch.dtype, quick: bool = False) -> list[list[float]]:
    """[[M, achieved FLOP/s], ...] of the engine's linear path at each row count M."""
    from infbench.measure.timing import time_op
    from infbench.model.linear import split_linear

    dim = 1024 if quick else 2048
    count = 4 if quick else 8  # 8 x 2048^2 fp32 = 128 MB: well past any CPU cache
    weights = [torch.randn(dim, dim, dtype=dtype, device=device) * 0.02 for _ in range(count)]
    linear = split_linear if device == "cpu" else torch.nn.functional.linear
    curve = []
    for m in TOKEN_COUNTS[:-2] if quick else TOKEN_COUNTS:
        x = torch.randn(m, dim, dtype=dtype, device=device)

        def run(x: torch.Tensor = x) -> None:
            for w in weights:
                linear(x, w)

        seconds = statistics.median(time_op(run, device, 3 if quick else 5, warmup=1))
        curve.append([float(m), 2.0 * m * dim * dim * count / seconds])
    return curve


def step_overhead(device: str, quick: bool = False) -> tuple[float, float, float]:
    """(per-step, per-layer, per-sequence-per-layer) seconds of the engine's decode loop,
    fitted on a hidden-64 model (bytes and FLOPs negligible) with 2 and 8 layers at batch
    1 and 8 layers at batch 16."""
    from infbench.core.config import EngineConfig
    from infbench.engine.engine import Engine, KVSizing
    from infbench.engine.request import Request, SamplingParams
    from infbench.model.loader import load_model

    gen = 16 if quick else 48
    times = {}
    for layers, batch in ((2, 1), (8, 1), (8, 16)):
        loaded = load_model({"preset": "tiny"}, dtype="float32", device=device,
                            overrides={"num_layers": layers})
        reqs = [Request(f"calib{i}", tuple(range(3, 11)),
                        SamplingParams(max_tokens=gen, ignore_eos=True)) for i in range(batch)]
        engine_cfg = EngineConfig()
        engine = Engine.create(loaded, engine_cfg, device, "float32",
                               sizing=KVSizing.for_requests(reqs, engine_cfg.block_size))
        engine.run(reqs)  # warm-up
        steps = engine.run(reqs).steps
        times[layers, batch] = statistics.median(s.duration_s for s in steps
                                                 if s.num_prefill_tokens == 0)
    per_layer = max(0.0, (times[8, 1] - times[2, 1]) / 6)
    per_seq_layer = max(0.0, (times[8, 16] - times[8, 1]) / (15 * 8))
    return max(0.0, times[2, 1] - 2 * per_layer), per_layer, per_seq_layer


def engine_extra(device: str, dtypes: tuple[str, ...], quick: bool) -> dict[str, Any]:
    from infbench.model.dtypes import TORCH_DTYPES

    curves = {d: matmul_curve(device, TORCH_DTYPES[d], quick) for d in dtypes
              if not (device == "cpu" and d != "float32")}  # CPU runs the engine in fp32
    per_step, per_layer, per_seq = step_overhead(device, quick)
    return {"matmul_flops_by_tokens": curves, "step_overhead_s": per_step,
            "layer_overhead_s": per_layer, "seq_layer_overhead_s": per_seq}

