"""MoE models in the engine: batch invariance, the fused CPU decode path refused, and the
routing statistics (experts touched, expert bytes) against the cost model's accounting."""

from __future__ import annotations

import pytest
from engine_helpers import greedy_recompute, make_engine, random_requests

from infbench.core.config import ModelConfig, QuantConfig
from infbench.core.errors import ConfigError
from infbench.engine.moe_stats import analytic_expert_bytes, summarize_counts
from infbench.model.fused_decode import build_decode_layers
from infbench.model.loader import load_model
from infbench.model.moe import MoEMLP
from infbench.model.transformer import Attention
from infbench.roofline.costs import kv_bytes_per_token, step_costs
from infbench.roofline.ops import SeqWork
from infbench.roofline.shapes import is_moe_layer, layer_weights, weight_bytes

# DeepSeek-V2-Lite's structure, tiny: MLA, first layer dense, 2 shared experts, groups.
LITE = {"num_layers": 3, "arch": "deepseek_v2",
        "attention": {"kind": "mla", "kv_lora_rank": 32, "q_lora_rank": None,
                      "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16},
        "moe": {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
                "num_shared_experts": 2, "first_k_dense": 1, "n_group": 4, "topk_group": 2,
                "routed_scaling_factor": 1.5}}


def _loaded(**overrides):
    return load_model({"preset": "tiny-moe"}, dtype="float32", device="cpu", seed=1,
                      overrides=overrides or None)


@pytest.mark.parametrize("over", [{}, LITE], ids=["tiny-moe", "lite-shaped"])
def test_batch_invariance_under_chunked_prefill_and_preemption(over):
    loaded = _loaded(**over)
    reqs = random_requests([3, 9, 14, 6, 11], gen=8, vocab=loaded.config.vocab_size)
    alone = {}
    for r in reqs:
        alone.update(make_engine(loaded, [r]).run([r]).outputs)
    first = reqs[0]
    assert alone[first.request_id] == greedy_recompute(loaded.model, list(first.prompt_ids), 8)
    cfg = loaded.config
    per_token = kv_bytes_per_token(cfg, "float32", QuantConfig())
    engine = make_engine(loaded, reqs, max_num_batched_tokens=8,
                         kv_cache_memory=per_token * 4 * 10)
    res = engine.run(reqs)
    assert res.outputs == alone
    assert sum(r.num_preemptions for r in res.requests) > 0
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in res.steps)


def test_fused_cpu_decode_layers_leave_moe_layers_to_the_per_op_path():
    loaded = _loaded(num_layers=3, moe={"first_k_dense": 1})
    plans = build_decode_layers(loaded.model, Attention)
    kinds = [type(layer.mlp) for layer in loaded.model.layers]
    assert kinds[0] is not MoEMLP and kinds[1] is MoEMLP and kinds[2] is MoEMLP
    assert plans[0] is not None and plans[1] is None and plans[2] is None
    # The engine's cpu backend then still decodes every MoE token exactly.
    reqs = random_requests([5, 7], gen=6, vocab=loaded.config.vocab_size)
    out = make_engine(loaded, reqs, backend="cpu").run(reqs).outputs
    for r in reqs:
        assert out[r.request_id] == greedy_recompute(loaded.model, list(r.prompt_ids), 6)


def test_expert_bytes_and_allocation_equal_the_cost_model():
    loaded = _loaded(**LITE)
    cfg: ModelConfig = loaded.config
    moe = cfg.moe
    assert moe is not None
    spec = next(s for s in cfg.layers() if is_moe_layer(cfg, s))
    # Allocation: the stacked experts, router and shared experts hold exactly the bytes the
    # roofline declares for an MoE layer's MLP.
    mlp = loaded.model.layers[spec.index].mlp
    held = sum(p.numel() * p.element_size() for p in mlp.parameters())
    declared = sum(w.nbytes(QuantConfig(), 4) for w in layer_weights(cfg, spec)
                   if w.op.startswith("moe_"))
    assert held == declared
    # and the whole model: what the loader reports equals the roofline's weight bytes
    assert loaded.weight_bytes == weight_bytes(cfg, "float32")
    per_expert = analytic_expert_bytes(cfg, 4)
    assert per_expert == (mlp.w13[0].numel() + mlp.w2[0].numel()) * 4
    # A step's expected bytes are what the roofline charges the routed experts for the
    # step's tokens (uniform routing), and the measured bytes with every expert touched
    # are all of the routed experts' weights.
    for tokens in (1, 5, 40):
        counts = [[0] * moe.num_experts for _ in range(2)]
        for row in counts:  # tokens * k picks spread round-robin over the experts
            for t in range(tokens * moe.num_experts_per_tok):
                row[t % moe.num_experts] += 1
        step = summarize_counts(counts, moe.num_experts_per_tok, int(per_expert), cfg,
                                per_expert)
        ops = step_costs(cfg, [SeqWork(tokens, tokens)], "float32", QuantConfig())
        priced = sum(op.weight_bytes for op in ops if op.name == "moe_experts")
        assert step.expected_bytes == pytest.approx(priced, rel=1e-12)
        assert step.num_tokens == tokens
        touched = min(tokens * moe.num_experts_per_tok, moe.num_experts)
        assert step.experts_touched == 2 * touched
        assert step.expert_bytes == 2 * touched * per_expert
    all_experts = sum(w.nbytes(QuantConfig(), 4) for w in layer_weights(cfg, spec) if w.expert)
    assert per_expert * moe.num_experts == all_experts


def test_measured_routing_in_step_records():
    loaded = _loaded(**LITE)
    moe = loaded.config.moe
    assert moe is not None
    reqs = random_requests([12, 5, 9], gen=5, vocab=loaded.config.vocab_size)
    res = make_engine(loaded, reqs).run(reqs)
    num_moe = 2
    per_expert = analytic_expert_bytes(loaded.config, 4)
    for s in res.steps:
        if s.moe is None:
            continue
        tokens = s.num_prefill_tokens + s.num_decode_tokens
        assert s.moe.num_tokens == tokens
        assert moe.num_experts_per_tok <= s.moe.experts_touched / num_moe <= moe.num_experts
        assert s.moe.expert_bytes == s.moe.experts_touched * per_expert
        assert s.moe.expected_experts == pytest.approx(
            num_moe * moe.expected_distinct_experts(tokens))
        assert s.moe.max_over_mean >= 1.0
    assert sum(1 for s in res.steps if s.moe is not None) == len(res.steps)


def test_cuda_graphs_are_not_captured_over_moe_layers():
    loaded = _loaded()
    reqs = random_requests([4], gen=2, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, reqs, cuda_graphs=True)
    assert [d["feature"] for d in engine.disabled] == ["cuda_graphs"]
    assert "MoE" in engine.disabled[0]["reason"]


def test_weight_quantization_of_an_moe_model_is_refused():
    with pytest.raises(ConfigError, match="allowed for MoE models: none") as info:
        load_model({"preset": "tiny-moe"}, quant=QuantConfig(weights="int8"))
    assert "\n" not in str(info.value)


def test_step_traffic_reads_the_experts_the_step_touched():
    """annotate_steps (MBU) charges the measured expert bytes instead of uniform routing's."""
    import dataclasses

    from infbench.hardware.spec import get_hardware
    from infbench.measure.traffic import annotate_steps

    loaded = _loaded(**LITE)
    reqs = random_requests([12, 5], gen=3, vocab=loaded.config.vocab_size)
    steps = make_engine(loaded, reqs).run(reqs).steps
    hw = get_hardware("cpu")
    measured = annotate_steps(steps, loaded.config, "float32", QuantConfig(), hw)
    uniform = annotate_steps([dataclasses.replace(s, moe=None) for s in steps], loaded.config,
                             "float32", QuantConfig(), hw)
    assert any(s.moe.expert_bytes != s.moe.expected_bytes for s in steps)
    for s, m, u in zip(steps, measured, uniform, strict=True):
        delta = s.moe.expert_bytes - s.moe.expected_bytes
        assert m["weight_bytes_read"] == pytest.approx(u["weight_bytes_read"] + delta)
        assert m["bytes"] == pytest.approx(u["bytes"] + delta)
        assert m["flops"] == u["flops"]


def test_triton_backend_runs_the_fused_kernel_in_the_engine():
    """backend triton (the Triton interpreter here): the fused-MoE kernel decodes the same
    greedy tokens as a full recompute with the torch reference."""
    loaded = _loaded()
    reqs = random_requests([6, 3], gen=3, vocab=loaded.config.vocab_size)
    engine = make_engine(loaded, reqs, backend="triton")
    assert all(m.use_kernel for m in loaded.model.modules() if isinstance(m, MoEMLP))
    out = engine.run(reqs).outputs
    for m in loaded.model.modules():
        if isinstance(m, MoEMLP):
            m.use_kernel = False  # the recompute below runs the torch reference
    for r in reqs:
        assert out[r.request_id] == greedy_recompute(loaded.model, list(r.prompt_ids), 3)
