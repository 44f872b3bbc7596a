"""Engine.abort: an aborted request leaves the scheduler and gives back every KV block,
whether it was waiting, running, forked into samples or sharing prefix-cached blocks."""

from __future__ import annotations

import time

from infbench.core.config import EngineConfig
from infbench.engine.engine import Engine, KVSizing
from infbench.engine.request import Request, SamplingParams
from infbench.engine.sequence import SeqStatus
from infbench.model.loader import load_model


def tiny_engine(max_num_seqs: int = 4) -> Engine:
    loaded = load_model({"preset": "tiny"}, dtype="float32", device="cpu", seed=0)
    cfg = EngineConfig(block_size=4, max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                       backend="torch", kv_cache_memory=float(64 << 20))
    return Engine.create(loaded, cfg, "cpu", "float32",
                         sizing=KVSizing.for_max_model_len(128, cfg), seed=0)


def _request(rid: str, prompt: list[int], max_tokens: int = 40, n: int = 1) -> Request:
    return Request(rid, tuple(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                      n=n))


def test_abort_waiting_and_running_requests_frees_their_blocks() -> None:
    engine = tiny_engine(max_num_seqs=2)
    bm = engine.block_manager
    free0 = bm.num_free_blocks
    shared = list(range(1, 17))  # 4 full blocks both prompts share (prefix caching)
    running = [engine.add_request(_request(f"r{i}", shared + [20 + i, 30])) for i in range(2)]
    waiting = engine.add_request(_request("w", shared + [40, 41]))
    for _ in range(3):
        engine.step(time.perf_counter)
    assert all(s.status is SeqStatus.RUNNING for s in running)
    assert waiting.status is SeqStatus.WAITING and bm.num_free_blocks < free0

    assert engine.abort("w") == [waiting]
    assert waiting.status is SeqStatus.FINISHED and waiting.finish_reason == "abort"
    assert engine.scheduler.num_waiting == 0
    removed = engine.abort("r0")
    assert removed == [running[0]] and running[0].block_table == []
    # r1 still holds the shared prefix blocks and its own: they stay referenced.
    assert engine.scheduler.running == [running[1]]
    assert all(bm.ref_count(b) >= 1 for b in running[1].block_table)
    engine.abort("r1")
    assert not engine.scheduler.has_unfinished
    assert bm.num_free_blocks == free0 and bm.num_used_blocks == 0
    assert engine.abort("r1") == []  # done already: nothing to do

    # The prefix cache still holds the shared blocks (evictable), and serves a new request.
    seq = engine.add_request(_request("again", shared + [50], max_tokens=2))
    while engine.scheduler.has_unfinished:
        engine.step(time.perf_counter)
    assert seq.num_cached_tokens == 16 and bm.num_free_blocks == free0


def test_abort_one_sample_keeps_the_others() -> None:
    engine = tiny_engine(max_num_seqs=4)
    bm = engine.block_manager
    free0 = bm.num_free_blocks
    parent = engine.add_request(_request("n3", list(range(1, 10)), max_tokens=12, n=3))
    engine.step(time.perf_counter)  # the prompt completes and forks into 3 samples
    assert engine.scheduler.num_running == 3
    removed = engine.abort("n3", sample_index=1)
    assert [s.sample_index for s in removed] == [1]
    assert sorted(s.sample_index for s in engine.scheduler.running) == [0, 2]
    finished = []
    while engine.scheduler.has_unfinished:
        finished += engine.step(time.perf_counter)[1]
    assert sorted(s.sample_index for s in finished) == [0, 2]
    assert all(len(s.output_ids) == 12 for s in finished) and parent in finished
    assert bm.num_free_blocks == free0


def test_abort_before_the_first_step_and_unknown_ids() -> None:
    engine = tiny_engine()
    free0 = engine.block_manager.num_free_blocks
    engine.add_request(_request("x", [1, 2, 3]))
    assert engine.abort("unknown") == []
    assert len(engine.abort("x")) == 1
    assert not engine.scheduler.has_unfinished
    assert engine.block_manager.num_free_blocks == free0
