"""End-to-end engine tests on tiny random models (CPU, torch backend).

The reference for every check is the model run without any cache: a full
recompute of the whole sequence for each new token (DenseContext).
"""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import greedy_recompute as _greedy_recompute
from engine_helpers import make_engine as _engine
from engine_helpers import random_requests as _requests

from infbench.core.config import ModelConfig
from infbench.engine.request import Request, SamplingParams
from infbench.model.loader import load_model


def _loaded(preset: str = "tiny", **overrides):
    return load_model({"preset": preset}, dtype="float32", device="cpu", seed=1,
                      overrides=overrides or None)


def test_prefill_then_decode_equals_full_recompute():
    loaded = _loaded()
    reqs = _requests([5, 11, 17], gen=12, vocab=loaded.config.vocab_size)
    out = _engine(loaded, reqs).run(reqs).outputs
    for r in reqs:
        assert out[r.request_id] == _greedy_recompute(loaded.model, list(r.prompt_ids), 12)


def test_batch_invariance_with_chunking_prefix_cache_and_preemption():
    loaded = _loaded()
    vocab = loaded.config.vocab_size
    prefix = tuple(range(10, 22))  # a shared 12-token "system prompt": 3 full blocks
    reqs = _requests([3, 9, 14, 6, 21, 2], gen=10, vocab=vocab, prefix=prefix)
    alone = {}
    for r in reqs:
        alone.update(_engine(loaded, [r]).run([r]).outputs)
    # Chunked prefill with a tiny token budget, prefix caching, and a KV pool so small
    # that running sequences must be preempted and recomputed.
    per_token = 2 * loaded.config.num_layers * loaded.config.kv_heads * loaded.config.dim_head * 4
    engine = _engine(loaded, reqs, max_num_batched_tokens=8, kv_cache_memory=per_token * 4 * 12)
    res = engine.run(reqs)
    assert res.outputs == alone
    assert sum(r.num_preemptions for r in res.requests) > 0
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in res.steps)
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in res.steps) <= 8
    # Prefix caching served part of a later prompt from the first one's blocks.
    big = _engine(loaded, reqs, max_num_batched_tokens=64, max_num_seqs=1)
    res2 = big.run(reqs)
    assert res2.outputs == alone
    assert sum(r.num_cached_prompt_tokens for r in res2.requests) >= 12 * (len(reqs) - 1)


def test_continuous_batching_admits_new_requests_each_step():
    loaded = _loaded()
    reqs = [dataclasses.replace(r, sampling=SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True))
            for i, r in enumerate(_requests([4] * 6, gen=8, vocab=loaded.config.vocab_size))]
    engine = _engine(loaded, reqs, max_num_seqs=2)
    res = engine.run(reqs)
    assert max(s.num_running for s in res.steps) <= 2
    # A new request joins as soon as one finishes, while the other keeps decoding.
    assert any(s.num_prefill_seqs and s.num_decode_seqs for s in res.steps)
    assert len(res.requests) == 6


def test_samples_share_prompt_blocks_and_diverge():
    loaded = _loaded()
    vocab = loaded.config.vocab_size
    prompt = tuple(range(5, 15))  # 10 tokens: the last block is partly filled and shared
    greedy = Request("g", prompt, SamplingParams(max_tokens=6, ignore_eos=True), n=3)
    sampled = Request("s", prompt, SamplingParams(temperature=1.0, max_tokens=6, seed=7,
                                                  ignore_eos=True), n=3)
    out = _engine(loaded, [greedy]).run([greedy]).outputs
    assert out["g/0"] == out["g/1"] == out["g/2"]
    assert out["g/0"] == _greedy_recompute(loaded.model, list(prompt), 6)
    e = _engine(loaded, [sampled])
    first = e.run([sampled]).outputs
    again = e.run([sampled]).outputs
    assert first == again  # per-request seeds: reproducible
    assert len({tuple(v) for v in first.values()}) > 1
    assert all(t < vocab for v in first.values() for t in v)


@pytest.mark.parametrize("kv_quant", ["none", "int8"])
def test_kv_bytes_per_token_match_the_analytic_model(kv_quant):
    """What the pool allocates per token (values and, quantized, their scales) is what
    `roofline.kv_bytes_per_token` prices, for every softmax-attention scheme."""
    from infbench.core.config import QuantConfig
    from infbench.roofline.costs import kv_bytes_per_token

    for preset, over in [("tiny", {}), ("tiny", {"attention": {"kind": "mha"}}),
                         ("tiny", {"attention": {"kind": "mqa"}}),
                         ("tiny", {"attention": {"kind": "cla", "cla_group": 2}}),
                         ("tiny", {"num_layers": 4, "attention": {
                             "kind": "sliding", "window": 8, "global_every": 2}})]:
        loaded = _loaded(preset, **over)
        reqs = _requests([4], gen=2, vocab=loaded.config.vocab_size)
        cfg: ModelConfig = loaded.config
        for dtype in ("float32", "bfloat16"):
            engine = _engine(loaded, reqs, dtype=dtype, kv_quant=kv_quant)
            predicted = kv_bytes_per_token(cfg, dtype, QuantConfig(kv=kv_quant))
            assert engine.kv.bytes_per_token == predicted, (over, dtype)
            if len(engine.kv.group_num_blocks) == 1:  # every tensor has num_blocks blocks
                assert engine.kv.total_bytes == engine.kv.num_blocks * 4 * predicted


def test_sliding_window_cache_stays_bounded():
    loaded = _loaded(attention={"kind": "sliding", "window": 8})
    reqs = _requests([6], gen=40, vocab=loaded.config.vocab_size)
    res = _engine(loaded, reqs).run(reqs)
    # window 8, block size 4: the window's blocks plus a partial one at each end, at most,
    # however long generation runs (46 tokens would need 12 blocks without freeing).
    assert max(s.kv_blocks_used for s in res.steps) <= 8 // 4 + 2
    assert res.outputs["r0"] == _greedy_recompute(loaded.model, list(reqs[0].prompt_ids), 40)


def test_request_longer_than_context_is_a_user_error():
    from infbench.core.errors import UserError

    loaded = _loaded()
    r = Request("long", tuple(range(3, 20)), SamplingParams(max_tokens=2000))
    engine = _engine(loaded, _requests([4], 2, loaded.config.vocab_size))
    with pytest.raises(UserError, match="context"):
        engine.add_request(r)


def test_cuda_graphs_are_ignored_with_a_warning_on_cpu():
    loaded = _loaded()
    reqs = _requests([5], gen=4, vocab=loaded.config.vocab_size)
    with pytest.warns(UserWarning, match="cuda_graphs ignored"):
        engine = _engine(loaded, reqs, cuda_graphs=True)
    assert engine.runner.graphs is None
    assert engine.run(reqs).outputs["r0"] == _greedy_recompute(
        loaded.model, list(reqs[0].prompt_ids), 4)


def test_cuda_graph_buckets_cover_every_batch_size():
    from infbench.engine.cuda_graphs import batch_buckets

    buckets = batch_buckets(50)
    assert buckets[:4] == [1, 2, 4, 8] and buckets[-1] == 50
    assert all(any(b >= n for b in buckets) for n in range(1, 51))
