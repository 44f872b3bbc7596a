"""The analytic price of masked-diffusion decoding (LLaDA / Dream), against autoregressive.

A diffusion step runs the bidirectional model over many positions at once: without a cache,
the prompt and all L generated positions (P + L query tokens, every step); with the
block-wise prefix cache (`engine/diffusion.py`), the first step of each block runs the whole
canvas and the block's other steps only the positions from the block on, attending to the
cached prefix.  Either way a step multiplies hundreds of token rows by each weight it reads:
its arithmetic intensity grows with P + L and it is compute-bound on hardware where an
autoregressive decode step (one row per sequence) is memory-bound.  Decoding takes S steps
for L tokens, so tokens/s = batch * L / sum(step times): fewer steps buy speed, and each
step costs about a prefill of the whole canvas.

Counting rules are the engine's (`layer_costs`) with one change: attention is
bidirectional, so q query tokens against c keys attend q * c (query, key) pairs instead of
the causal count.  The step's new K/V are counted as in a prefill (written once, read by the
attention); logits are computed for the current block's B positions only, as the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.decoding import check_diffusion_plan
from infbench.hardware.spec import HardwareSpec
from infbench.roofline.analysis import bound_of, check_context, predict, roofline_time
from infbench.roofline.costs import group_costs
from infbench.roofline.layer_costs import attended_pairs
from infbench.roofline.ops import OpCost, SeqWork, total


@dataclass(frozen=True)
class DiffusionStepShape:
    """One step's work per sequence, and how many steps of a decode have it."""

    query_len: int
    context_len: int
    num_logits: int
    count: int


@dataclass(frozen=True)
class DiffusionStepPrice:
    shape: DiffusionStepShape
    cost: OpCost  # the whole batch, one step
    time_s: float
    bound: str


@dataclass(frozen=True)
class DiffusionPrediction:
    model: str
    hardware: str
    dtype: str
    batch: int
    prompt_len: int
    gen_len: int
    steps: int
    block_length: int
    prefix_cache: bool
    step_prices: tuple[DiffusionStepPrice, ...]
    total_time_s: float
    tokens_per_s: float  # batch * L / total time
    ar_total_time_s: float  # the same model decoding L tokens autoregressively (prefill + decode)
    ar_tokens_per_s: float
    ar_decode_intensity: float  # FLOP/byte of a mean autoregressive decode step
    ar_decode_bound: str

    @property
    def mean_step_time_s(self) -> float:
        return self.total_time_s / self.steps

    @property
    def intensity(self) -> float:
        """FLOP/byte over the whole decode (every step's FLOPs over every step's bytes)."""
        flops = sum(p.cost.flops * p.shape.count for p in self.step_prices)
        nbytes = sum(p.cost.bytes * p.shape.count for p in self.step_prices)
        return flops / nbytes if nbytes else 0.0


def check_diffusion(gen_len: int, steps: int, block_length: int) -> None:
    """The engine's plan rules: B divides L, S a multiple of L / B, S <= L."""
    check_diffusion_plan(gen_len, steps, block_length)


def diffusion_schedule(prompt_len: int, gen_len: int, steps: int, block_length: int,
                       prefix_cache: bool) -> list[DiffusionStepShape]:
    """The distinct step shapes of one decode (what `engine.diffusion` runs), with counts."""
    check_diffusion(gen_len, steps, block_length)
    full = prompt_len + gen_len
    blocks = gen_len // block_length
    per_block = steps // blocks
    if not prefix_cache:
        return [DiffusionStepShape(full, full, block_length, steps)]
    shapes = [DiffusionStepShape(full, full, block_length, blocks)]  # each block's first step
    if per_block > 1:
        for k in range(blocks):
            query = full - (prompt_len + k * block_length)
            shapes.append(DiffusionStepShape(query, full, block_length, per_block - 1))
    return shapes


def diffusion_step_costs(cfg: ModelConfig, shape: DiffusionStepShape, batch: int, dtype: str,
                         quant: QuantConfig | None = None) -> list[OpCost]:
    """FLOPs and bytes of one diffusion step of `batch` sequences, by operator name."""
    work = SeqWork(shape.query_len, shape.context_len, shape.num_logits)
    ops = group_costs(cfg, [(work, batch)], dtype, quant)
    full_pairs = shape.query_len * shape.context_len
    out = []
    for op in ops:
        if op.name in ("attn_score", "attn_value"):
            # Layers differ only by window, and diffusion models here have none.
            causal = attended_pairs(shape.context_len, shape.query_len, None)
            op = replace(op, flops=op.flops * full_pairs / causal)
        out.append(op)
    return out


def _ar_reference(cfg: ModelConfig, hw: HardwareSpec, batch: int, prompt_len: int,
                  gen_len: int, dtype: str,
                  quant: QuantConfig | None) -> tuple[float, float, str]:
    p = predict(cfg, hw, batch=batch, prompt_len=prompt_len, gen_len=gen_len, dtype=dtype,
                quant=quant)
    e2e = p.ttft_s + (gen_len - 1) * p.time_per_token_s
    return e2e, p.decode.cost.intensity, p.decode.bound


def predict_diffusion(cfg: ModelConfig, hw: HardwareSpec, *, batch: int, prompt_len: int,
                      gen_len: int, steps: int, block_length: int | None = None,
                      prefix_cache: bool = False, dtype: str = "bfloat16",
                      quant: QuantConfig | None = None) -> DiffusionPrediction:
    """Time and tokens/s of decoding L tokens in S steps, beside autoregressive decoding."""
    block = gen_len if block_length is None else block_length
    check_context(cfg, prompt_len, gen_len)
    shapes = diffusion_schedule(prompt_len, gen_len, steps, block, prefix_cache)
    overhead = hw.step_overhead_s(cfg.num_layers, batch)
    prices = []
    for shape in shapes:
        step = total(diffusion_step_costs(cfg, shape, batch, dtype, quant))
        tokens = batch * shape.query_len
        prices.append(DiffusionStepPrice(
            shape, step, roofline_time(step.flops, step.bytes, hw, dtype, tokens) + overhead,
            bound_of(step.flops, step.bytes, hw, dtype, tokens)))
    total_s = sum(p.time_s * p.shape.count for p in prices)
    ar_s, ar_intensity, ar_bound = _ar_reference(cfg, hw, batch, prompt_len, gen_len, dtype,
                                                 quant)
    return DiffusionPrediction(
        cfg.name, hw.name, dtype, batch, prompt_len, gen_len, steps, block, prefix_cache,
        tuple(prices), total_s, batch * gen_len / total_s, ar_s, batch * gen_len / ar_s,
        ar_intensity, ar_bound)


def diffusion_dict(p: DiffusionPrediction) -> dict[str, Any]:
    """The JSON object of a diffusion prediction (bytes, seconds, FLOP/byte)."""
    return {
        "model": p.model, "hardware": p.hardware, "dtype": p.dtype, "batch": p.batch,
        "prompt_len": p.prompt_len, "gen_len": p.gen_len, "steps": p.steps,
        "block_length": p.block_length, "prefix_cache": p.prefix_cache,
        "total_time_s": p.total_time_s, "mean_step_time_s": p.mean_step_time_s,
        "tokens_per_s": p.tokens_per_s, "intensity": p.intensity,
        "step_kinds": [
            {"query_len": s.shape.query_len, "context_len": s.shape.context_len,
             "num_logits": s.shape.num_logits, "count": s.shape.count,
             "flops": s.cost.flops, "bytes": s.cost.bytes, "intensity": s.cost.intensity,
             "time_s": s.time_s, "bound": s.bound}
            for s in p.step_prices
        ],
        "autoregressive": {"total_time_s": p.ar_total_time_s,
                           "tokens_per_s": p.ar_tokens_per_s,
                           "decode_intensity": p.ar_decode_intensity,
                           "decode_bound": p.ar_decode_bound},
    }


