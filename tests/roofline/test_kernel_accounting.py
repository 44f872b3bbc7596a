"""The cost model's attention accounting equals the sum of the kernels' declared costs.

The engine prices every measured step with `roofline.costs.step_costs`; these
tests pin that to what the kernels themselves declare they read and compute, so
the measured roofline and `infbench kernels bench` agree on bytes and FLOPs.
"""

from __future__ import annotations

import pytest

from infbench.core.config import ModelConfig, QuantConfig
from infbench.roofline.costs import SeqWork, step_costs
from kernels.paged_decode_attention import paged_decode_attention_cost
from kernels.prefill_attention import prefill_attention_cost

CASES = {
    "gqa": ModelConfig.from_name("tiny"),
    "mha": ModelConfig.from_name("tiny", attention={"kind": "mha"}),
    "sliding": ModelConfig.from_name("tiny", attention={"kind": "sliding", "window": 24}),
}


def _attention(cfg: ModelConfig, seqs: list[SeqWork]) -> tuple[float, float]:
    ops = {o.name: o for o in step_costs(cfg, seqs, "float32", QuantConfig())}
    attn = [ops["attn_score"], ops["attn_value"]]
    return sum(o.flops for o in attn), sum(o.bytes for o in attn)


@pytest.mark.parametrize("name", CASES)
def test_decode_step_attention_equals_decode_kernel_costs(name):
    cfg = CASES[name]
    lens = [5, 17, 40, 64]
    flops, nbytes = _attention(cfg, [SeqWork(1, n) for n in lens])
    per_layer = [paged_decode_attention_cost(
        len(lens), cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.dim_head, lens, 4,
        window=spec.window) for spec in cfg.layers()]
    assert flops == pytest.approx(sum(c.flops for c in per_layer))
    assert nbytes == pytest.approx(sum(c.bytes for c in per_layer))


@pytest.mark.parametrize("name", CASES)
def test_prefill_step_attention_equals_prefill_kernel_costs(name):
    cfg = CASES[name]
    queries, contexts = [7, 30, 12], [7, 45, 12]  # the second one has cached context
    flops, nbytes = _attention(cfg, [SeqWork(q, c) for q, c in zip(queries, contexts, strict=True)])
    per_layer = [prefill_attention_cost(
        cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.dim_head, queries, contexts, 4,
        window=spec.window) for spec in cfg.layers()]
    assert flops == pytest.approx(sum(c.flops for c in per_layer))
    assert nbytes == pytest.approx(sum(c.bytes for c in per_layer))
