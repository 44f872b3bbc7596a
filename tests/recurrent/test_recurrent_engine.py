"""Linear attention, SSM and hybrid stacks through the paged engine (CPU).

The reference for every check is the model without any cache: a full recompute of
the whole sequence for each new token (DenseContext, zero states).
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import greedy_recompute, random_requests
from engine_helpers import make_engine as _engine

from infbench.engine.request import Request
from infbench.model.loader import load_model
from infbench.roofline.costs import kv_bytes_per_token, state_bytes_per_seq

KINDS = {
    "linear-elu": {"kind": "linear", "feature_map": "elu"},
    "linear-relu": {"kind": "linear", "feature_map": "relu"},
    "linear-favor": {"kind": "linear", "feature_map": "favor", "feature_dim": 24},
    "linear-taylor": {"kind": "linear", "feature_map": "taylor"},
    "ssm": {"kind": "ssm", "d_state": 8},
    # tiny has 2 layers: attn_every=2 makes layer 1 a GQA attention layer, layer 0 recurrent
    "hybrid-ssm": {"kind": "ssm", "d_state": 8, "attn_every": 2},
    "hybrid-linear": {"kind": "linear", "feature_map": "elu", "attn_every": 2},
}
PROMPTS, GEN = [5, 11, 3, 8], 6


def _loaded(attention, **overrides):
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=1,
                        overrides={"attention": attention, **overrides})
    # With the preset's N(0, 0.02) init the mixers barely move the residual stream and
    # the tokens follow the embeddings; unit-gain matrices make a wrong state (stale,
    # skipped or doubled) change the tokens.
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if name.endswith(("A_log", "dt_proj.bias")):  # decays from fast to slow
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return loaded


def _requests(vocab: int) -> list[Request]:
    return random_requests(PROMPTS, GEN, vocab)


@pytest.mark.parametrize("kind", list(KINDS))
def test_engine_equals_recompute_with_chunking_and_slot_reuse(kind):
    loaded = _loaded(KINDS[kind])
    cfg = loaded.config
    reqs = _requests(cfg.vocab_size)
    one_shot = _engine(loaded, reqs).run(reqs, realtime_arrivals=False)
    for r in reqs:
        assert one_shot.outputs[r.request_id] == greedy_recompute(
            loaded.model, list(r.prompt_ids), GEN, cfg), r.request_id
    assert any(s.num_decode_seqs > 1 for s in one_shot.steps)  # batched recurrent decode
    # Chunked prefill: the 11- and 8-token prompts continue from their stored states.
    chunked = _engine(loaded, reqs, max_num_batched_tokens=4).run(reqs, realtime_arrivals=False)
    assert chunked.outputs == one_shot.outputs
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in chunked.steps) <= 4
    assert any(s.num_prefill_seqs and s.num_decode_seqs for s in chunked.steps)
    # Two state slots for four requests: later requests reuse slots that hold the
    # finished ones' states, and must start from zero anyway.
    reuse = _engine(loaded, reqs, max_num_seqs=2, max_num_batched_tokens=4)
    res = reuse.run(reqs, realtime_arrivals=False)
    assert res.outputs == one_shot.outputs
    assert max(s.num_running for s in res.steps) <= 2


@pytest.mark.parametrize("kind", ["hybrid-ssm", "hybrid-linear"])
def test_hybrid_preemption_recomputes_states(kind):
    loaded = _loaded(KINDS[kind])
    reqs = _requests(loaded.config.vocab_size)
    alone = _engine(loaded, reqs).run(reqs, realtime_arrivals=False).outputs
    # 6 blocks of 4 tokens for 51 tokens of requests: running sequences get preempted,
    # lose their state slot and are recomputed from position 0.
    per_token = kv_bytes_per_token(loaded.config, "float32")
    engine = _engine(loaded, reqs, max_num_batched_tokens=8, kv_cache_memory=per_token * 4 * 6)
    res = engine.run(reqs, realtime_arrivals=False)
    assert sum(r.num_preemptions for r in res.requests) > 0
    assert res.outputs == alone


@pytest.mark.parametrize("kind", ["linear-taylor", "hybrid-ssm"])
def test_triton_backend_equals_torch_backend(kind):
    """The decode kernels (interpreter on CPU) inside the engine give the same tokens."""
    loaded = _loaded(KINDS[kind])
    reqs = _requests(loaded.config.vocab_size)[:2]
    torch_out = _engine(loaded, reqs).run(reqs, realtime_arrivals=False).outputs
    engine = _engine(loaded, reqs, backend="triton")
    assert engine.ops.name == "triton"
    assert engine.run(reqs, realtime_arrivals=False).outputs == torch_out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", [*KINDS, "jamba"])
def test_state_and_kv_bytes_match_the_analytic_model(kind, dtype):
    if kind == "jamba":  # one GQA attention layer per block of 8 (layer 4), 7 Mamba layers
        loaded = _loaded({"kind": "ssm", "d_state": 8, "attn_every": 8}, num_layers=8)
    else:
        loaded = _loaded(KINDS[kind])
    cfg = loaded.config
    engine = _engine(loaded, _requests(cfg.vocab_size), dtype=dtype)
    assert engine.states is not None
    assert engine.states.bytes_per_seq == state_bytes_per_seq(cfg, dtype) > 0
    assert engine.kv.bytes_per_token == kv_bytes_per_token(cfg, dtype)
    num_attention = sum(spec.mixer == "attention" for spec in cfg.layers())
    assert num_attention == (0 if kind in ("linear-elu", "linear-relu", "linear-favor",
                                           "linear-taylor", "ssm") else 1)
    per_layer = 2 * cfg.kv_heads * cfg.dim_head * (4 if dtype == "float32" else 2)
    assert engine.kv.bytes_per_token == num_attention * per_layer


def test_favor_features_are_derived_from_the_config_not_the_checkpoint():
    from infbench.model.linear_attention import FAVOR_SEED, _favor_projection

    a = load_model({"preset": "tiny"}, seed=1, overrides={"attention": KINDS["linear-favor"]})
    b = load_model({"preset": "tiny"}, seed=2, overrides={"attention": KINDS["linear-favor"]})
    proj = [layer.self_attn.projection for layer in a.model.layers]
    assert proj[0].shape == (24, a.config.dim_head)
    # Materialized on the meta device and re-derived after to_empty: the same map for
    # every load, one per layer, and never saved with the weights.
    assert torch.equal(proj[0], _favor_projection(24, a.config.dim_head, FAVOR_SEED))
    assert torch.equal(proj[1], b.model.layers[1].self_attn.projection)
    assert not torch.equal(proj[0], proj[1])
    assert not any("projection" in key for key in a.model.state_dict())
