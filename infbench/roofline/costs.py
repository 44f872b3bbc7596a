"""Per-operator FLOPs and bytes of one engine step or one stage.

`step_costs(cfg, seqs, dtype, quant)` is the single entry point: `seqs` is the
batch composition of a step (what the scheduler hands the runner), so the same
function prices a whole-prompt prefill, a decode step, a chunked-prefill step
mixing both, and a speculative verification.  The engine calls it for every real
step to turn measured step times into achieved bandwidth and FLOP/s.
`group_costs(cfg, groups, ...)` takes the same composition as (SeqWork, count)
groups, so pricing `batch` identical sequences costs O(1) in the batch (the
analytic `predict` never builds a list of a million SeqWork); `step_costs` groups
its list and calls it, so both give identical numbers.

Operators are summed over layers by name ("embed", "norm", "qkv_proj",
"attn_score", "attn_value", "o_proj", "mlp", "moe_*", "linear_attn", "ssm_*",
"lm_head"); `by_layer=True` returns them per layer instead, and the by-name totals
are exactly the sums of the per-layer ones.  Counting rules are in
`infbench.roofline.layer_costs`; sizes (parameters, KV, state) in `shapes`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from infbench.core.config import MAX_BATCH, ModelConfig, QuantConfig, check_count
from infbench.core.errors import ConfigError
from infbench.roofline.layer_costs import FIELDS, SOFTCAP_FLOPS, Totals, add, layer_costs
from infbench.roofline.ops import OpCost, SeqWork, merge_by_name, total
from infbench.roofline.shapes import (
    ParamCount,
    dtype_bytes,
    is_moe_layer,
    kv_bytes_per_token,
    kv_cache_bytes,
    param_count,
    state_bytes_per_seq,
    weight_bytes,
)

__all__ = [
    "OpCost",
    "ParamCount",
    "SeqWork",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "merge_by_name",
    "param_count",
    "state_bytes_per_seq",
    "group_costs",
    "step_costs",
    "total",
    "weight_bytes",
]


def _to_ops(rows: Totals, stage: str, layer: int | None) -> list[OpCost]:
    return [
        OpCost(name, kind, stage=stage, layer=layer, **dict(zip(FIELDS, values, strict=True)))
        for name, (kind, *values) in rows.items()
    ]


def _model_level(cfg: ModelConfig, num_tokens: int, num_logits: int, a: int,
                 first: Totals, last: Totals, quant: QuantConfig) -> None:
    d, v = cfg.hidden_size, cfg.vocab_size
    # The embedding is a gather: only the rows of this step's tokens are read (in a GGUF
    # file's own format under native weights).
    row_bytes = d * quant.weight_bits(d, a, "embed", v) / 8.0
    add(first, "embed", "gather", weight=num_tokens * row_bytes, act=num_tokens * d * a)
    add(last, "norm", "elementwise", flops=4.0 * num_tokens * d, weight=d * a,
        act=2.0 * num_tokens * d * a)
    if num_logits:
        head_bytes = v * d * quant.weight_bits(d, a, "lm_head", v) / 8.0  # quant.head
        add(last, "lm_head", "matmul", flops=2.0 * num_logits * d * v, weight=head_bytes,
            act=num_logits * (d + v) * a)
        if cfg.final_logit_softcap is not None:  # Gemma-2: divide, tanh, multiply per logit
            add(last, "lm_head", "matmul", flops=SOFTCAP_FLOPS * num_logits * v)


def step_costs(
    cfg: ModelConfig,
    seqs: Sequence[SeqWork],
    dtype: str,
    quant: QuantConfig | None = None,
    *,
    by_layer: bool = False,
    stage: str = "step",
) -> list[OpCost]:
    """FLOPs and bytes of one forward step over `seqs`, one OpCost per operator name.

    Weights are read once per step whatever the batch; KV and state per sequence;
    the LM head runs only for the tokens that need logits (`SeqWork.num_logits`).
    """
    if not seqs:
        raise ConfigError("a step needs at least one sequence")
    return group_costs(cfg, tuple(Counter(seqs).items()), dtype, quant, by_layer=by_layer,
                       stage=stage)


def group_costs(
    cfg: ModelConfig,
    groups: Sequence[tuple[SeqWork, int]],
    dtype: str,
    quant: QuantConfig | None = None,
    *,
    by_layer: bool = False,
    stage: str = "step",
) -> list[OpCost]:
    """`step_costs` of a batch given as (SeqWork, number of such sequences) groups."""
    if not groups:
        raise ConfigError("a step needs at least one sequence")
    for _, n in groups:
        check_count("", "sequences in a batch group", n, MAX_BATCH)
    quant = quant or QuantConfig()
    a = dtype_bytes(dtype)
    kvb = quant.kv_bytes(a)
    num_tokens = sum(sw.query_len * n for sw, n in groups)
    num_logits = sum(sw.num_logits * n for sw, n in groups)
    first: Totals = {}
    last: Totals = {}
    _model_level(cfg, num_tokens, num_logits, a, first, last, quant)

    cache: dict[tuple[object, ...], Totals] = {}
    per_layer: list[tuple[int, Totals]] = []
    for spec in cfg.layers():
        # Layers with the same signature cost the same: price each signature once.
        key = (spec.mixer, spec.window, spec.chunk, spec.rope, spec.owns_kv,
               is_moe_layer(cfg, spec))
        if key not in cache:
            cache[key] = layer_costs(cfg, spec, groups, a, kvb, quant)
        per_layer.append((spec.index, cache[key]))

    if by_layer:
        ops = _to_ops(first, stage, None)
        for index, rows in per_layer:
            ops += _to_ops(rows, stage, index)
        return ops + _to_ops(last, stage, None)
    # Same order of additions as merge_by_name over the per-layer list: identical sums.
    summed: Totals = {}
    for rows in [first, *(rows for _, rows in per_layer), last]:
        for name, (kind, *values) in rows.items():
            add(summed, name, kind, *values)
    return _to_ops(summed, stage, None)
