"""Per-layer-group KV pools: a sliding-window model with global layers (engine/kv_groups.py).

Tiny hybrid: 4 layers, window 8, every 2nd layer global, block size 4, so the
windowed and the full layers each form one KV group with its own pool and tables.
The reference is the model run without any cache (DenseContext), as in test_engine.
"""

from __future__ import annotations

from engine_helpers import greedy_recompute as _greedy_recompute
from engine_helpers import make_engine as _engine
from engine_helpers import random_requests as _requests

from infbench.core.config import QuantConfig
from infbench.engine.kv_groups import GroupedBlockManager, kv_group_windows
from infbench.engine.request import Request, SamplingParams
from infbench.measure.metrics import summarize
from infbench.model.loader import load_model
from infbench.roofline.costs import kv_bytes_per_token
from infbench.roofline.shapes import kv_cache_bytes

WINDOW = 8
BLOCK = 4


def _hybrid():
    return load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=1, overrides={
        "num_layers": 4, "attention": {"kind": "sliding", "window": WINDOW, "global_every": 2}})


def test_hybrid_has_two_groups_and_exact_bytes_per_token():
    loaded = _hybrid()
    cfg = loaded.config
    assert kv_group_windows(cfg) == [None, WINDOW]
    reqs = _requests([4], gen=2, vocab=cfg.vocab_size)
    engine = _engine(loaded, reqs)
    assert isinstance(engine.block_manager, GroupedBlockManager)
    assert len(engine.kv.group_num_blocks) == 2
    assert engine.kv.bytes_per_token == kv_bytes_per_token(cfg, "float32", QuantConfig())


def test_greedy_equals_recompute_with_chunking_and_preemption():
    loaded = _hybrid()
    cfg = loaded.config
    reqs = _requests([3, 9, 14, 6, 21, 2], gen=10, vocab=cfg.vocab_size)
    expected = {r.request_id: _greedy_recompute(loaded.model, list(r.prompt_ids), 10)
                for r in reqs}
    assert _engine(loaded, reqs).run(reqs).outputs == expected
    # Chunked prefill with a tiny token budget and a pool so small that sequences are
    # preempted and recomputed.
    per_token = kv_bytes_per_token(cfg, "float32", QuantConfig())
    engine = _engine(loaded, reqs, max_num_batched_tokens=8,
                     kv_cache_memory=per_token * BLOCK * 12)
    res = engine.run(reqs)
    assert res.outputs == expected
    assert sum(r.num_preemptions for r in res.requests) > 0
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in res.steps) <= 8


def test_windowed_group_stays_bounded_while_full_group_grows():
    loaded = _hybrid()
    reqs = _requests([6], gen=40, vocab=loaded.config.vocab_size)
    engine = _engine(loaded, reqs)
    used: list[list[int]] = []
    res = engine.run(reqs, on_step=lambda _: used.append(
        engine.block_manager.group_used_blocks()))
    full, windowed = zip(*used, strict=True)
    # window 8 (a multiple of the block size 4): the window's blocks plus one partial block.
    assert max(windowed) <= WINDOW // BLOCK + 1
    # The full group holds the whole context: 44 computed tokens before the last step.
    assert max(full) == -(-44 // BLOCK)
    assert list(full) == sorted(full[:-1]) + [full[-1]]  # grows until the request finishes
    assert res.outputs["r0"] == _greedy_recompute(loaded.model, list(reqs[0].prompt_ids), 40)


def test_peak_kv_bytes_match_the_analytic_model():
    loaded = _hybrid()
    cfg = loaded.config
    prompt, gen, batch = 20, 12, 2
    reqs = _requests([prompt] * batch, gen=gen, vocab=cfg.vocab_size)
    engine = _engine(loaded, reqs)
    res = engine.run(reqs)
    m = summarize(res.requests, res.steps, res.wall_s, kv_bytes_per_token=engine.kv.bytes_per_token,
                  block_size=BLOCK, weight_bytes=loaded.weight_bytes, peak_memory_bytes=0)
    predicted = kv_cache_bytes(cfg, "float32", QuantConfig(), prompt + gen, batch)
    # Block rounding: at most one block per group per sequence either way.
    bound = batch * sum(BLOCK * engine.kv.group_bytes_per_token(g) for g in range(2))
    assert abs(m["peak_kv_bytes"] - predicted) <= bound, (
        f"measured {m['peak_kv_bytes']} vs predicted {predicted}: more than one block per "
        f"group per sequence ({bound} bytes) apart")
    # Without the groups the windowed layers would hold the whole context.
    assert m["peak_kv_bytes"] < batch * (prompt + gen) * engine.kv.bytes_per_token
    assert 0.0 <= m["kv_fragmentation"] < 1.0


def test_n_samples_fork_per_group():
    loaded = _hybrid()
    vocab = loaded.config.vocab_size
    prompt = tuple(range(5, 15))  # 10 tokens: the last block is partly filled and shared
    greedy = Request("g", prompt, SamplingParams(max_tokens=12, ignore_eos=True), n=3)
    out = _engine(loaded, [greedy]).run([greedy]).outputs
    assert out["g/0"] == out["g/1"] == out["g/2"]
    assert out["g/0"] == _greedy_recompute(loaded.model, list(prompt), 12)
    sampled = Request("s", prompt, SamplingParams(temperature=1.0, max_tokens=12, seed=7,
                                                  ignore_eos=True), n=3)
    e = _engine(loaded, [sampled])
    first = e.run([sampled]).outputs
    assert first == e.run([sampled]).outputs  # per-request seeds: reproducible
    assert len(first) == 3 and len({tuple(v) for v in first.values()}) > 1
    assert all(len(v) == 12 and all(t < vocab for t in v) for v in first.values())
