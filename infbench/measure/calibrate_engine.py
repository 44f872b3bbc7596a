"""Engine-level calibration: matmul efficiency by token count, decode attention, overhead.

A datasheet roofline assumes every GEMM runs at peak, attention reads the KV cache at full
bandwidth and a step costs nothing but its bytes and FLOPs.  On a CPU (and on a GPU without
CUDA graphs) none of these holds: a decode GEMM with 16 rows runs at a fraction of the
large-GEMM peak, a paged attention kernel reads KV rows scattered over cache blocks slower
than a stream, and every layer pays a fixed dispatch cost.  `infbench calibrate` measures
all three through the code the engine runs (the backend `engine.backend: auto` picks,
recorded as `engine_backend`) and stores them in the profile's `extra`:

- `matmul_flops_by_tokens[dtype]`: [[M, FLOP/s], ...] of the engine's linear layer (on a
  CPU the C++ GEMV / skinny GEMM up to 32 rows and the BLAS above, `kernel_linear`; with the
  torch backend `split_linear`; F.linear on a GPU) for M = 1 .. 8192 rows, over a stack of
  weight matrices whose inner dimensions K span 576 .. 4096 (the hidden and MLP widths of
  the models infbench runs: the skinny kernels' rate moves about 10% with K) and whose
  size is at least four times the last-level cache (`matmul_stack_bytes`): at few rows
  the weights must come from DRAM, as a model's do.  Above 64 rows the step is
  compute-bound and a 64 MiB stack keeps the time short.
- `quant_matmul_flops_by_tokens[int8|int4]`: the same for the `cpu` backend's quantized
  projections (dequantize-in-GEMV with float activations, `kernels.cpu_quant_linear`) at
  1 .. 32 rows, int8 with a scale per row and int4 in groups of 64, over stored weights four
  times the last-level cache.  Above 32 rows the engine dequantizes and runs the float GEMM,
  which the float curve prices.
- `decode_attention_bytes_per_s`: KV bytes per second of the engine's paged decode
  attention kernel (`Ops.decode_attention`) over 16 sequences of 512 tokens in caches of
  two GQA shapes (head_dim 64 and 128), their blocks in random order as a long-running
  engine leaves them, again over four times the last-level cache (`attention_stack_bytes`).
- `prefill_attention_flops_per_s`: FLOP/s of the engine's causal prefill attention kernel
  (`Ops.prefill_attention`) over 4 prompts of 512 tokens in the same two shapes: it is
  compute-bound, and on a CPU runs at a third of the GEMM peak or less.
- `step_overhead_s`, `layer_overhead_s` and `seq_layer_overhead_s`: fitted to the
  decode step time of tiny-width models (2 and 8 layers at batch 1, 8 layers at batch
  16) whose weights and KV are negligible, so the step time is the engine's fixed
  cost: per step, per layer, and per sequence per layer.

Each matmul point, the two attention rates and each of the three step times is a calibrated
figure (`hardware.checks.Figure`): a round of repeats, re-measured when it spreads
too far; a rate is the best repeat, a step time the shortest (the least disturbed).

`HardwareSpec.peak_at`, `HardwareSpec.attention_bandwidth` and `HardwareSpec.step_overhead_s`
read them back; the analysis uses them only when a profile has them (never for datasheet
entries).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch

from infbench.hardware.checks import STEP_FIGURES, Figure, fit_fixed_costs, measure_figure
from infbench.hardware.spec import QUANT_FORMATS
from infbench.measure.timing import time_op

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048, 8192)
STREAMED_ROWS = 64  # up to this many rows the stack must stream from DRAM
MATMUL_KS = (576, 1024, 1536, 2048, 2816, 4096)  # inner dimensions of the weight stack
MATRIX_ELEMENTS = 1 << 21  # each matrix of the stack: about 2M weights, N = that / K
SMALL_STACK = 64 << 20  # bytes of the stack above STREAMED_ROWS (compute-bound there)
QUICK_STACK = 16 << 20
MIN_STACK = 512 << 20
MAX_STACK = 2 << 30
# (query heads, KV heads, head_dim) of the attention caches: two GQA shapes
ATTENTION_SHAPES = ((16, 4, 64), (32, 8, 128))
ATTENTION_SEQS, ATTENTION_CONTEXT, ATTENTION_BLOCK = 16, 512, 16


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The CPU's largest cache in bytes (Linux sysfs), or None when it cannot be read."""
    from pathlib import Path

    sizes = []
    for index in Path(root).glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text[-1:] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes) if sizes else None


def stack_bytes(device: str, quick: bool) -> int:
    """Bytes of weights (or KV) a figure streams through: four times the last-level cache
    (on a GPU its L2 is tens of MB; 512 MiB is far past it), within 512 MiB .. 2 GiB."""
    if quick:
        return QUICK_STACK
    llc = last_level_cache_bytes() if device == "cpu" else None
    return min(MAX_STACK, max(MIN_STACK, 4 * (llc or 0)))


def engine_backend(device: str) -> str:
    """The kernel backend `engine.backend: auto` runs on `device` (cpu, torch or triton)."""
    import warnings

    from infbench.engine.backend import resolve_backend

    with warnings.catch_warnings():  # auto without the C++ kernels warns; the profile says so
        warnings.simplefilter("ignore")
        return resolve_backend("auto", torch.device(device))


def backend_linear(backend: str) -> Any:
    """The engine's projection for `backend` (model/linear.py's choice per backend)."""
    from infbench.model.linear import kernel_linear, split_linear

    return {"cpu": kernel_linear, "torch": split_linear}.get(backend,
                                                             torch.nn.functional.linear)


def weight_stack(device: str, dtype: torch.dtype, nbytes: int) -> list[torch.Tensor]:
    """Matrices (N, K) for every K of MATMUL_KS in turn, about `nbytes` in all."""
    shapes = [(max(16, MATRIX_ELEMENTS // k // 16 * 16), k) for k in MATMUL_KS]
    per_round = sum(n * k for n, k in shapes) * torch.finfo(dtype).bits // 8
    rounds = max(1, round(nbytes / per_round))
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=dtype)
            for _ in range(rounds) for n, k in shapes]


def _rows_figure(linear: Any, m: int, stack: list[Any], device: str, dtype: torch.dtype,
                 quick: bool) -> Figure:
    """FLOP/s of `linear(x, w)` over every matrix w of `stack` with M = `m` activation rows,
    as a figure (the stack's matrices, float or Int8Weight / Int4Weight, have `.shape`)."""
    xs = {k: torch.randn(m, k, dtype=dtype, device=device) for k in MATMUL_KS}

    def run(x: dict[int, torch.Tensor] = xs, weights: list[Any] = stack) -> None:
        for w in weights:
            linear(x[w.shape[1]], w)

    flops = 2.0 * m * sum(w.shape[0] * w.shape[1] for w in stack)

    def one_round() -> list[float]:
        return [flops / t for t in time_op(run, device, 3 if quick else 5, warmup=1)]

    return measure_figure(one_round)


def matmul_curve(device: str, dtype: torch.dtype, quick: bool = False,
                 backend: str | None = None) -> dict[int, Figure]:
    """M -> the achieved FLOP/s of the engine's linear path at M rows, as a figure."""
    linear = backend_linear(backend or engine_backend(device))
    big = weight_stack(device, dtype, stack_bytes(device, quick))
    small = big if quick else weight_stack(device, dtype, SMALL_STACK)
    return {m: _rows_figure(linear, m, big if m <= STREAMED_ROWS else small, device, dtype,
                            quick)
            for m in (TOKEN_COUNTS[:-3] if quick else TOKEN_COUNTS)}


QUANT_GROUP = 64  # int4's group size in the quantized curve; int8 has one scale per row
QUANT_ROWS = (1, 2, 4, 8, 16, 32)  # the C++ dequantize-in-GEMV range (cpu_linear.MAX_ROWS)


def quant_stack(fmt: str, nbytes: int) -> list[Any]:
    """Int8Weight / Int4Weight matrices of every K of MATMUL_KS in turn, about `nbytes` of
    stored weights and scales: one round quantized, the rest copies of it (distinct memory,
    so nothing is served from a cache)."""
    from kernels.quant_format import quantize_int4, quantize_int8

    gen = torch.Generator().manual_seed(0)
    first = []
    for k in MATMUL_KS:
        w = torch.randn(max(16, MATRIX_ELEMENTS // k // 16 * 16), k, generator=gen) * 0.02
        first.append(quantize_int8(w) if fmt == "int8" else quantize_int4(w, QUANT_GROUP))
    rounds = max(1, round(nbytes / sum(w.nbytes for w in first)))
    return first + [copy.deepcopy(w) for _ in range(rounds - 1) for w in first]


def quant_matmul_curve(fmt: str, quick: bool = False) -> dict[int, Figure]:
    """M -> FLOP/s of the `cpu` backend's dequantize-in-GEMV (`kernels.cpu_quant_linear`, float
    activations) on `fmt` weights at M = 1 .. 32 rows, over stored weights four times the
    last-level cache, as a figure per M."""
    from kernels.cpu_quant_linear import cpu_quant_linear

    stack = quant_stack(fmt, stack_bytes("cpu", quick))
    return {m: _rows_figure(cpu_quant_linear, m, stack, "cpu", torch.float32, quick)
            for m in (QUANT_ROWS[:4] if quick else QUANT_ROWS)}


def decode_attention_bandwidth(device: str, quick: bool = False,
                               backend: str | None = None) -> Figure:
    """KV bytes per second the engine's paged decode attention reads, as a figure: 16
    sequences of 512 tokens per layer cache, caches of the ATTENTION_SHAPES in turn, their
    blocks in random order, about `stack_bytes` of KV in all."""
    from infbench.engine.backend import get_ops
    from infbench.model.dtypes import TORCH_DTYPES

    ops = get_ops(backend or engine_backend(device), torch.device(device))
    dtype = TORCH_DTYPES["float32" if device == "cpu" else "bfloat16"]  # the engine's default
    seqs, context, block = (4, 128, ATTENTION_BLOCK) if quick else (
        ATTENTION_SEQS, ATTENTION_CONTEXT, ATTENTION_BLOCK)
    blocks_per_seq = context // block
    gen = torch.Generator().manual_seed(0)
    tables = torch.randperm(seqs * blocks_per_seq, generator=gen).to(torch.int32)
    tables = tables.view(seqs, blocks_per_seq).contiguous().to(device)
    lens = torch.full((seqs,), context, dtype=torch.int32, device=device)
    esize = torch.finfo(dtype).bits // 8
    per_pair = sum(seqs * context * hkv * 2 * d * esize for _, hkv, d in ATTENTION_SHAPES)
    pairs = max(1, round(stack_bytes(device, quick) / per_pair))
    layers = []
    for _ in range(pairs):
        for hq, hkv, d in ATTENTION_SHAPES:
            shape = (seqs * blocks_per_seq, block, hkv, d)
            k = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
            v = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
            q = torch.randn(seqs, hq, d, generator=gen).to(device=device, dtype=dtype)
            layers.append((q, k, v, d ** -0.5))
    nbytes = float(sum(k.numel() + v.numel() for _, k, v, _ in layers) * esize)

    def run() -> None:
        for q, k, v, scale in layers:
            ops.decode_attention(q, k, v, tables, lens, scale)

    def one_round() -> list[float]:
        return [nbytes / t for t in time_op(run, device, 3 if quick else 5, warmup=1)]

    return measure_figure(one_round)


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


def prefill_attention_flops(device: str, quick: bool = False,
                            backend: str | None = None) -> Figure:
    """FLOP/s of the engine's causal prefill attention (`Ops.prefill_attention`), as a
    figure: 4 prompts of 512 tokens per layer, layers of the ATTENTION_SHAPES in turn, FLOPs
    counted as the cost model counts them (4 x causal pairs x query heads x head_dim)."""
    from infbench.engine.backend import get_ops
    from infbench.model.dtypes import TORCH_DTYPES

    ops = get_ops(backend or engine_backend(device), torch.device(device))
    dtype = TORCH_DTYPES["float32" if device == "cpu" else "bfloat16"]
    seqs, prompt, block = (2, 128, ATTENTION_BLOCK) if quick else (4, 512, ATTENTION_BLOCK)
    blocks_per_seq = prompt // block
    gen = torch.Generator().manual_seed(0)
    tables = torch.arange(seqs * blocks_per_seq, dtype=torch.int32, device=device)
    tables = tables.view(seqs, blocks_per_seq)
    lens = torch.full((seqs,), prompt, dtype=torch.int32, device=device)
    cu = torch.arange(0, (seqs + 1) * prompt, prompt, dtype=torch.int32, device=device)
    layers = []
    flops = 0.0
    for hq, hkv, d in ATTENTION_SHAPES:
        shape = (seqs * blocks_per_seq, block, hkv, d)
        k = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        v = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        q = torch.randn(seqs * prompt, hq, d, generator=gen).to(device=device, dtype=dtype)
        layers.append((q, k, v, d ** -0.5))
        flops += 4.0 * seqs * prompt * (prompt + 1) / 2 * hq * d

    def run() -> None:
        for q, k, v, scale in layers:
            ops.prefill_attention(q, k, v, cu, lens, tables, scale)

    def one_round() -> list[float]:
        return [flops / t for t in time_op(run, device, 3 if quick else 5, warmup=1)]

    return measure_figure(one_round)


def engine_extra(device: str, dtypes: tuple[str, ...], quick: bool
                 ) -> tuple[dict[str, Any], dict[str, Figure]]:
    """The profile's engine terms, and their figures (`matmul.<dtype>.<M>`,
    `decode_attention_bytes_per_s`, `prefill_attention_flops_per_s`,
    `decode_step_s.<layers>x<batch>`)."""
    from infbench.model.dtypes import TORCH_DTYPES

    backend = engine_backend(device)
    curves = {d: matmul_curve(device, TORCH_DTYPES[d], quick, backend) for d in dtypes
              if not (device == "cpu" and d != "float32")}  # CPU runs the engine in fp32
    # the quantized kernels' curves where the engine runs them (the C++ backend's GEMV)
    quant = {f: quant_matmul_curve(f, quick) for f in QUANT_FORMATS} if backend == "cpu" else {}
    attention = decode_attention_bandwidth(device, quick, backend)
    prefill = prefill_attention_flops(device, quick, backend)
    times = step_time_figures(device, quick)
    per_step, per_layer, per_seq = fit_fixed_costs(*(times[k].value for k in STEP_FIGURES))
    figures = {f"matmul.{d}.{m}": fig for d, curve in curves.items() for m, fig in curve.items()}
    figures.update({f"quant_matmul.{f}.{m}": fig for f, curve in quant.items()
                    for m, fig in curve.items()})
    figures["decode_attention_bytes_per_s"] = attention
    figures["prefill_attention_flops_per_s"] = prefill
    figures.update({name: times[k] for k, name in STEP_FIGURES.items()})
    llc = last_level_cache_bytes() if device == "cpu" else None
    extra = {"matmul_flops_by_tokens": {d: [[float(m), fig.value] for m, fig in curve.items()]
                                        for d, curve in curves.items()},
             "decode_attention_bytes_per_s": attention.value,
             "prefill_attention_flops_per_s": prefill.value,
             "engine_backend": backend,
             "matmul_stack_bytes": stack_bytes(device, quick),
             "attention_stack_bytes": stack_bytes(device, quick),
             # stored clamped at zero; check_profile refuses a fit negative beyond noise
             "step_overhead_s": max(0.0, per_step), "layer_overhead_s": max(0.0, per_layer),
             "seq_layer_overhead_s": max(0.0, per_seq)}
    if quant:
        extra["quant_matmul_flops_by_tokens"] = {
            f: [[float(m), fig.value] for m, fig in curve.items()] for f, curve in quant.items()}
    if llc is not None:
        extra["last_level_cache_bytes"] = llc
    return extra, figures
