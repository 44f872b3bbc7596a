"""Rows behind `infbench predict`, `kv`, `models`, `hardware` and `roofline` (no printing).

The commands render these as rich tables or JSON; keeping the rows here lets later
work add measured columns (from result files) next to the predicted ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from infbench.core.config import (
    MAX_BATCH,
    MAX_TOKENS,
    PRESETS,
    ModelConfig,
    QuantConfig,
    check_count,
)
from infbench.core.parallel import SINGLE, ParallelConfig
from infbench.hardware.spec import HARDWARE, HardwareSpec, MemoryReserve
from infbench.roofline.analysis import Prediction, check_context, max_batch
from infbench.roofline.costs import (
    kv_bytes_per_token,
    kv_cache_bytes,
    param_count,
    state_bytes_per_seq,
)
from infbench.roofline.shapes import dtype_bytes, mla_dims

POINT_KINDS = ("predicted", "measured")


@dataclass(frozen=True)
class RooflinePoint:
    """One point on a roofline (plotted by infbench.plots; defined here so the analytic
    package never imports plotting).

    group: a predicted and a measured point with the same group are joined by a line.
    series: legend entry and colour (default: the group).
    """

    label: str
    intensity: float  # FLOP per byte
    flops_per_s: float
    kind: str = "predicted"  # predicted | measured
    group: str = ""
    series: str = ""
    stage: str = ""  # prefill | decode | a measured step kind (metadata only)
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in POINT_KINDS:
            raise ValueError(f"RooflinePoint.kind must be one of {POINT_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class KVRow:
    """KV footprint of one model at one context and batch."""

    model: str
    attention: str
    kv_heads: int
    kv_bytes_per_token: int
    kv_cache_bytes: int  # whole batch at the context
    mha_kv_cache_bytes: int  # an MHA model of the same shape, same context and batch
    state_bytes_per_seq: int
    reduction: float  # MHA KV / (KV + constant state), per sequence
    max_batch: int
    context_len: int
    batch: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mha_kv_bytes_per_token(cfg: ModelConfig, kv_bytes: float, scale_bytes: int = 0) -> int:
    """KV per token of full MHA with the same layers, heads and head dims.

    For MLA that is the decompressed per-head K (nope + rope) and V a plain cache
    would hold.  `scale_bytes`: a quantized cache's scale per head per K and per V row.
    """
    if cfg.attention.kind == "mla":
        _, rope, nope, v = mla_dims(cfg)
        per_layer = cfg.num_heads * (math.ceil((nope + rope) * kv_bytes)
                                     + math.ceil(v * kv_bytes) + 2 * scale_bytes)
    else:
        per_layer = 2 * cfg.num_heads * (math.ceil(cfg.dim_head * kv_bytes) + scale_bytes)
    return cfg.num_layers * per_layer


def kv_rows(models: Sequence[ModelConfig], *, context_len: int, batch: int, hw: HardwareSpec,
            dtype: str = "bfloat16", quant: QuantConfig | None = None,
            parallel: ParallelConfig = SINGLE,
            reserve: MemoryReserve | None = None) -> list[KVRow]:
    """KV footprint rows; `max_batch` is per replica on `parallel`'s devices, within the
    usable memory `reserve` leaves (default: `MemoryReserve()`)."""
    check_count("", "context_len", context_len, MAX_TOKENS)
    check_count("", "batch", batch, MAX_BATCH)
    quant = quant or QuantConfig()
    reserve = reserve or MemoryReserve()
    kvb = quant.kv_bytes(dtype_bytes(dtype))
    rows = []
    for cfg in models:
        check_context(cfg, context_len, 0)
        parallel.check_model(cfg)
        kv = kv_cache_bytes(cfg, dtype, quant, context_len, batch)
        state = state_bytes_per_seq(cfg, dtype)
        mha = mha_kv_bytes_per_token(cfg, kvb, quant.kv_scale_bytes) * context_len * batch
        rows.append(KVRow(
            model=cfg.name, attention=cfg.attention.kind, kv_heads=cfg.kv_heads,
            kv_bytes_per_token=kv_bytes_per_token(cfg, dtype, quant), kv_cache_bytes=kv,
            mha_kv_cache_bytes=mha, state_bytes_per_seq=state,
            reduction=mha / (kv + state * batch),
            max_batch=max_batch(cfg, hw, dtype, quant, context_len, parallel, reserve),
            context_len=context_len, batch=batch,
        ))
    return rows


def scheme_name(cfg: ModelConfig) -> str:
    """A short name of the KV scheme: gqa-8, mla-64+16, cla-2, sliding-4096/g4, ssm-16,
    gqa-8 chunk-8192/nope-12 (Llama-4: chunked layers, and how many NoPE layers), ..."""
    a = cfg.attention
    names = {
        "mha": "mha", "mqa": "mqa", "gqa": f"gqa-{cfg.kv_heads}",
        "mla": f"mla-{a.kv_lora_rank}+{a.qk_rope_head_dim}",
        "cla": f"cla-{a.cla_group} (kv {cfg.kv_heads})",
        "sliding": f"sliding-{a.window}" + (f"/g{a.global_every}" if a.global_every else ""),
        "linear": f"linear-{a.feature_map}", "ssm": f"ssm-{a.d_state}",
    }
    name = names[a.kind]
    if a.kind in ("linear", "ssm") and a.attn_every:
        name += f" + attn 1:{a.attn_every - 1}"
    if cfg.attention_chunk is not None:
        name += f" chunk-{cfg.attention_chunk}" + (
            f"/nope-{len(cfg.nope_layers)}" if cfg.nope_layers else "")
    return name


def model_rows() -> list[dict[str, Any]]:
    rows = []
    for name, cfg in PRESETS.items():
        params = param_count(cfg)
        rows.append({
            "model": name,
            "params": params.total,
            "active_params": params.active,
            "layers": cfg.num_layers,
            "hidden": cfg.hidden_size,
            "heads": cfg.num_heads,
            "kv_heads": cfg.kv_heads,
            "attention": cfg.attention.kind,
            "kv_bytes_per_token_bf16": kv_bytes_per_token(cfg, "bfloat16"),
            "max_seq_len": cfg.max_seq_len,
        })
    return rows


def hardware_rows(reserve: MemoryReserve | None = None) -> list[dict[str, Any]]:
    """The table's entries; `usable_memory_bytes` is the capacity x the reserve's utilization."""
    reserve = reserve or MemoryReserve()
    return [
        {
            "hardware": name,
            "description": hw.description,
            "peak_flops": dict(hw.peak_flops),
            "bandwidth_bytes_per_s": hw.bandwidth,
            "memory_bytes": hw.memory_bytes,
            "usable_memory_bytes": hw.memory_bytes * reserve.utilization,
            "ridge_point_bf16": hw.ridge_point("bfloat16"),
            "interconnect": asdict(hw.interconnect) if hw.interconnect else None,
            "source": hw.source,
        }
        for name, hw in HARDWARE.items()
    ]


def roofline_points(predictions: Sequence[Prediction], include_ops: bool = True
                    ) -> list[RooflinePoint]:
    """Predicted stages (and operators) placed at their intensity and FLOP/s."""
    points = []
    for p in predictions:
        for stage in (p.prefill, p.decode):
            points.append(RooflinePoint(
                f"{stage.stage} b={p.batch}", stage.intensity, stage.flops / stage.time_s,
                "predicted", f"{stage.stage}/b{p.batch}", series=f"{stage.stage} (step)",
                stage=stage.stage, batch=p.batch))
            if not include_ops:
                continue
            for op in stage.ops:
                if op.cost.flops <= 0 or op.cost.bytes <= 0:
                    continue  # a pure gather has no place on a log-log roofline
                points.append(RooflinePoint(
                    f"{op.cost.name} ({stage.stage}, b={p.batch})", op.cost.intensity,
                    op.cost.flops / op.time_s, "predicted",
                    f"{stage.stage}/{op.cost.name}/b{p.batch}",
                    series=f"{stage.stage} {op.cost.name}", stage=stage.stage, batch=p.batch))
    return points
