"""Scheduler: continuous batching, chunked prefill, preemption, prefix hits, forks, stops.

A pure-Python driver plays the runner: it applies the block copies, writes every
scheduled token into a model of the physical KV pool, checks that each scheduled
sequence can read all its earlier tokens back from its block table, and samples a
deterministic function of the sequence's tokens.  Outputs therefore depend only
on the request, so any schedule (tiny pool, preemptions, chunking) must reproduce
the reference outputs exactly.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infbench.core.config import EngineConfig
from infbench.core.errors import UserError
from infbench.engine.block_manager import RELEASED, BlockManager, StateSlots
from infbench.engine.request import Request, SamplingParams
from infbench.engine.scheduler import Scheduler, SchedulerOutput
from infbench.engine.sequence import SeqStatus, Sequence

VOCAB = 50


def next_token(tokens: list[int], sample_index: int) -> int:
    return (31 * sum((i + 1) * t for i, t in enumerate(tokens[-8:])) + len(tokens)
            + 7 * sample_index) % VOCAB  # fmt: skip


def reference(req: Request, sample_index: int, eos: int | None = None) -> tuple[list[int], str]:
    """What any schedule must produce for sample `sample_index` of `req`."""
    sp, out = req.sampling, []
    while True:
        token = next_token(list(req.prompt_ids) + out, sample_index)
        out.append(token)
        if token == eos and not sp.ignore_eos:
            return out, "eos"
        if token in sp.stop_token_ids:
            return out, "stop"
        if len(out) == sp.max_tokens:
            return out, "length"


def req(rid: str, prompt: list[int], max_tokens: int = 8, n: int = 1, **kw: object) -> Request:
    return Request(rid, tuple(prompt), SamplingParams(max_tokens=max_tokens, **kw), n=n)  # type: ignore[arg-type]


@dataclass
class Run:
    sched: Scheduler
    bm: BlockManager
    config: EngineConfig
    window: int | None = None
    kv: dict[int, int] = field(default_factory=dict)  # physical slot -> token
    steps: list[SchedulerOutput] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    added: dict[str, Sequence] = field(default_factory=dict)

    def add(self, request: Request) -> Sequence:
        seq = Sequence.from_request(request, self.sched.next_seq_id())
        self.sched.add(seq)
        self.added[request.request_id] = seq
        return seq

    def step(self) -> SchedulerOutput:
        running_before = {s.seq_id for s in self.sched.running}
        out = self.sched.schedule()
        scheduled_ids = {s.seq.seq_id for s in out.scheduled}
        assert not scheduled_ids & {s.seq_id for s in out.preempted}
        if out.preempted:  # no admissions in a step that had to preempt (no thrashing)
            assert scheduled_ids <= running_before
        self._check_and_execute(out)
        sampled = {
            s.seq.seq_id: [next_token(s.seq.token_ids, s.seq.sample_index + j)
                           for j in range(s.num_samples)]
            for s in out.scheduled if s.num_samples
        }  # fmt: skip
        self.finished += self.sched.update(out, sampled, float(len(self.steps)))
        self.steps.append(out)
        assert self.sched.num_running <= self.config.max_num_seqs
        check_blocks(self.bm, self.sched.running)
        return out

    def _check_and_execute(self, out: SchedulerOutput) -> None:
        cfg, bm, bs = self.config, self.bm, self.bm.block_size
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert 0 < out.num_batched_tokens <= cfg.max_num_batched_tokens or out.is_empty
        assert out.num_prefill_tokens + out.num_decode_tokens == out.num_batched_tokens
        assert len({s.seq.seq_id for s in out.scheduled}) == len(out.scheduled)
        for src, dst in out.block_copies:  # the runner copies before the forward
            for off in range(bs):
                if src * bs + off in self.kv:
                    self.kv[dst * bs + off] = self.kv[src * bs + off]
        written: set[int] = set()
        for s in out.scheduled:
            seq, end = s.seq, s.start_pos + s.num_new_tokens
            assert seq.status is SeqStatus.RUNNING and s.start_pos == seq.num_computed_tokens
            assert 0 < s.num_new_tokens and end <= seq.num_tokens
            if not cfg.enable_chunked_prefill:  # split only a recompute too long for a step
                assert (
                    end == seq.num_tokens
                    or seq.num_tokens - s.start_pos > cfg.max_num_batched_tokens
                )
            assert s.num_samples == (0 if end < seq.num_tokens else max(1, seq.n))
            for pos in range(s.start_pos, end):
                slot = bm.slot(seq, pos)
                assert slot not in written, "two sequences write one slot (missing CoW)"
                written.add(slot)
                self.kv[slot] = seq.token_ids[pos]
        for s in out.scheduled:  # attention reads every earlier token still in the window
            seq, end = s.seq, s.start_pos + s.num_new_tokens
            first = 0 if self.window is None else max(0, s.start_pos - self.window)
            for pos in range(first, end):
                assert seq.block_table[pos // bs] != RELEASED
                assert self.kv[bm.slot(seq, pos)] == seq.token_ids[pos], (seq.seq_id, pos)

    def run(self, arrivals: dict[int, list[Request]], max_steps: int = 5000) -> None:
        last = max(arrivals, default=0)
        for t in range(max_steps):
            for request in arrivals.get(t, []):
                self.add(request)
            if t > last and not self.sched.has_unfinished:
                return
            if self.sched.has_unfinished:
                self.step()
        raise AssertionError("requests did not finish")

    def outputs(self) -> dict[tuple[str, int], tuple[list[int], str | None]]:
        return {(s.request_id, s.sample_index): (s.output_ids, s.finish_reason)
                for s in self.finished}  # fmt: skip


def check_blocks(bm: BlockManager, running: list[Sequence]) -> None:
    refs = Counter(b for s in running for b in s.block_table if b != RELEASED)
    assert all(bm.ref_count(b) == k for b, k in refs.items())
    assert bm.num_used_blocks == len(refs)
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def make_run(
    num_blocks: int = 64,
    block_size: int = 4,
    prefix: bool = True,
    window: int | None = None,
    eos: int | None = None,
    state_slots: StateSlots | None = None,
    **engine: object,
) -> Run:
    config = EngineConfig(block_size=block_size, **engine)  # type: ignore[arg-type]
    bm = BlockManager(num_blocks, block_size, prefix)
    return Run(Scheduler(config, bm, state_slots, window, eos), bm, config, window)


def expected(requests: list[Request], eos: int | None = None) -> dict:
    return {(r.request_id, k): reference(r, k, eos) for r in requests for k in range(r.n)}


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 17 + i * 5) % VOCAB for i in range(length)]


# -------------------------------------------------------------------- tests
def test_scheduler_modules_do_not_import_torch() -> None:
    code = (
        "import sys; import infbench.engine.scheduler, infbench.engine.block_manager; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_request_added_mid_run_joins_the_next_step() -> None:
    run = make_run(max_num_batched_tokens=64)
    a, b = req("a", prompt(1, 10)), req("b", prompt(2, 6))
    run.add(a)
    for _ in range(3):
        run.step()
    run.add(b)
    out = run.step()
    assert [(s.seq.request_id, s.start_pos, s.num_new_tokens, s.is_prefill)
            for s in out.scheduled] == [("a", 12, 1, False), ("b", 0, 6, True)]  # fmt: skip
    assert (out.num_prefill_tokens, out.num_decode_tokens) == (6, 1)
    run.run({})
    assert run.outputs() == expected([a, b])


def test_chunked_prefill_respects_the_token_budget() -> None:
    run = make_run(max_num_batched_tokens=16)
    a, b = req("a", prompt(1, 50), max_tokens=4), req("b", prompt(2, 5), max_tokens=4)
    run.run({0: [a], 1: [b]})
    chunks = [[(s.seq.request_id, s.start_pos, s.num_new_tokens, s.num_samples)
               for s in out.scheduled] for out in run.steps[:4]]  # fmt: skip
    assert chunks == [
        [("a", 0, 16, 0)],
        [("a", 16, 16, 0)],
        [("a", 32, 16, 0)],
        [("a", 48, 2, 1), ("b", 0, 5, 1)],
    ]
    assert all(out.num_batched_tokens <= 16 for out in run.steps)
    assert run.outputs() == expected([a, b])


def test_without_chunked_prefill_a_prompt_waits_for_room() -> None:
    run = make_run(max_num_batched_tokens=16, enable_chunked_prefill=False)
    a, b = req("a", prompt(1, 12)), req("b", prompt(2, 10))
    run.run({0: [a, b]})
    assert [(s.seq.request_id, s.num_new_tokens) for s in run.steps[0].scheduled] == [("a", 12)]
    assert [(s.seq.request_id, s.num_new_tokens) for s in run.steps[1].scheduled] == [
        ("a", 1),
        ("b", 10),
    ]
    assert run.outputs() == expected([a, b])


def test_max_num_seqs_bounds_the_batch() -> None:
    run = make_run(max_num_seqs=2)
    requests = [req(f"r{i}", prompt(i, 3 + i), max_tokens=3 + i) for i in range(6)]
    run.run({0: requests})
    assert len(run.steps[0].scheduled) == 2
    assert max(len(out.scheduled) for out in run.steps) == 2
    assert run.outputs() == expected(requests)


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_preemption_with_a_tiny_pool_gives_the_same_outputs(prefix: bool) -> None:
    requests = [req(f"r{i}", prompt(i % 3, 9 + 2 * i), max_tokens=12) for i in range(6)]
    arrivals = {0: requests[:4], 3: requests[4:]}
    big = make_run(num_blocks=200, prefix=prefix)
    big.run(arrivals)
    tiny = make_run(num_blocks=9, prefix=prefix)  # the longest request alone needs 8 blocks
    tiny.run(arrivals)
    assert sum(len(out.preempted) for out in big.steps) == 0
    assert sum(len(out.preempted) for out in tiny.steps) > 0
    assert any(s.num_preemptions for s in tiny.finished)
    assert tiny.outputs() == big.outputs() == expected(requests)
    assert tiny.bm.num_used_blocks == 0 and tiny.bm.num_free_blocks == 9


def test_preempted_sequence_goes_to_the_front_of_the_queue() -> None:
    run = make_run(num_blocks=4, max_num_batched_tokens=64)
    a, b, c = req("a", prompt(1, 4), 8), req("b", prompt(2, 4), 8), req("c", prompt(3, 4), 8)
    run.add(a)
    run.add(b)
    run.step()  # a and b hold two of the four blocks each after their prompts
    run.add(c)
    preempted = []
    while not preempted:
        preempted = run.step().preempted
    assert [s.request_id for s in preempted] == ["b"]  # the latest admitted
    assert [s.request_id for s in run.sched.waiting] == ["b", "c"]
    assert preempted[0].num_computed_tokens == 0 and preempted[0].block_table == []
    run.run({})
    assert run.outputs() == expected([a, b, c])


def test_a_step_that_preempts_admits_nothing() -> None:
    # b preempts itself at position 8; its first 7-token recompute chunk would fit the two
    # blocks it frees, but re-admitting it in the same step would only thrash.
    run = make_run(num_blocks=5, prefix=False, max_num_batched_tokens=8)
    a, b = req("a", prompt(1, 4), 12), req("b", prompt(2, 4), 12)
    run.add(a)
    run.add(b)
    out = run.step()
    while not out.preempted:
        out = run.step()
    assert [s.request_id for s in out.preempted] == ["b"]
    assert [s.seq.request_id for s in out.scheduled] == ["a"]
    assert run.bm.num_free_blocks == 2 and run.sched.num_waiting == 1
    out = run.step()
    assert [(s.seq.request_id, s.start_pos, s.num_new_tokens) for s in out.scheduled] == [
        ("a", 9, 1),
        ("b", 0, 7),
    ]
    run.run({})
    assert run.outputs() == expected([a, b])


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_prefix_cache_hits_are_counted(prefix: bool) -> None:
    run = make_run(prefix=prefix)
    system = prompt(9, 8)  # two blocks of 4
    a, b = req("a", system + [1, 2, 3]), req("b", system + [4, 5])
    run.add(a)
    run.step()
    run.step()
    seq_b = run.add(b)
    out = run.step()
    item = next(s for s in out.scheduled if s.seq is seq_b)
    if prefix:
        assert (seq_b.num_cached_tokens, item.start_pos, item.num_new_tokens) == (8, 8, 2)
        assert seq_b.block_table[:2] == run.added["a"].block_table[:2]
    else:
        assert (seq_b.num_cached_tokens, item.start_pos, item.num_new_tokens) == (0, 0, 10)
    run.run({})
    assert run.outputs() == expected([a, b])


@pytest.mark.parametrize("budget", [64, 3], ids=["whole-prompt", "chunks-of-3"])
def test_blocks_filled_by_chunks_and_decodes_are_cached(budget: int) -> None:
    """update commits a block whenever one fills up (it skips the call otherwise)."""
    run = make_run(prefix=True, max_num_batched_tokens=budget)
    a = req("a", prompt(3, 6), max_tokens=11)  # 16 computed tokens; blocks 1-3 fill decoding
    run.add(a)
    run.run({})
    seq_a = run.added["a"]
    seq_b = run.add(req("b", seq_a.prompt_ids + seq_a.output_ids + [1]))
    run.step()
    assert seq_b.num_cached_tokens == 16  # all four full blocks of a, found by hash
    run.run({})


@pytest.mark.parametrize("prompt_len, num_copies", [(6, 2), (8, 0)], ids=["mid-block", "boundary"])
def test_n_samples_fork_and_copy_on_first_divergent_write(prompt_len: int, num_copies: int) -> None:
    run = make_run()
    r = req("r", prompt(4, prompt_len), max_tokens=5, n=3)
    parent = run.add(r)
    out = run.step()
    assert [s.num_samples for s in out.scheduled] == [3]
    assert [(p.seq_id, c.sample_index) for p, c in run.sched.forked] == [
        (parent.seq_id, 1),
        (parent.seq_id, 2),
    ]
    group = run.sched.running
    assert len(group) == 3 and all(s.block_table == parent.block_table for s in group)
    assert all(run.bm.ref_count(b) == 3 for b in parent.block_table)
    assert parent.n == 1 and len({s.seq_id for s in group}) == 3
    out = run.step()
    assert len(out.block_copies) == num_copies
    assert run.bm.ref_count(parent.block_table[0]) == 3  # the full prompt block stays shared
    run.run({})
    outputs = run.outputs()
    assert outputs == expected([r])
    assert len({tuple(outputs[("r", k)][0]) for k in range(3)}) == 3


def tokens_of(r: Request) -> list[int]:
    return reference(r, 0)[0]


@pytest.mark.parametrize("kind", ["eos", "stop", "length", "ignore_eos"])
def test_stop_conditions(kind: str) -> None:
    base = req("r", prompt(5, 7), max_tokens=10)
    full = tokens_of(base)
    target = full[2]
    stop_at = full.index(target) + 1
    eos = target if kind in ("eos", "ignore_eos") else None
    sampling = {"stop": {"stop_token_ids": (target,)}, "ignore_eos": {"ignore_eos": True}}
    r = req("r", prompt(5, 7), max_tokens=10, **sampling.get(kind, {}))
    run = make_run(eos=eos)
    run.run({0: [r]})
    (seq,) = run.finished
    reason = {"eos": "eos", "stop": "stop"}.get(kind, "length")
    assert seq.finish_reason == reason and seq.is_finished
    assert seq.output_ids == (full[:stop_at] if reason != "length" else full)
    assert seq.token_times_s == [float(i) for i in range(len(seq.output_ids))]
    assert run.sched.num_running == 0 and run.bm.num_used_blocks == 0


def test_impossible_requests_raise_user_errors() -> None:
    run = make_run(num_blocks=4, max_num_seqs=2)
    with pytest.raises(UserError, match="KV budget"):
        run.add(req("long", prompt(1, 10), max_tokens=7))  # 17 tokens > 4 blocks of 4
    with pytest.raises(UserError, match="engine.max_num_seqs"):
        run.add(req("many", prompt(1, 3), n=3))
    strict = make_run(max_num_batched_tokens=8, enable_chunked_prefill=False)
    with pytest.raises(UserError, match="engine.max_num_batched_tokens"):
        strict.add(req("p", prompt(1, 9)))
    assert not run.sched.has_unfinished and not strict.sched.has_unfinished


def test_programming_errors_are_caught() -> None:
    run = make_run()
    seq = Sequence.from_request(req("a", [1, 2]), 0)
    run.sched.add(seq)
    with pytest.raises(ValueError, match="in use"):
        run.sched.add(Sequence.from_request(req("b", [1, 2]), 0))
    out = run.sched.schedule()
    with pytest.raises(ValueError, match="sampled tokens"):
        run.sched.update(out, {}, 0.0)
    with pytest.raises(ValueError, match="prefix caching"):
        Scheduler(EngineConfig(), BlockManager(8, 4), StateSlots(2))


def test_sliding_window_bounds_the_blocks_in_use() -> None:
    run = make_run(num_blocks=16, window=8)
    r = req("r", prompt(6, 10), max_tokens=50)
    run.add(r)
    used = []
    while run.sched.has_unfinished:
        run.step()
        used.append(run.bm.num_used_blocks)
    # After an update the last 8 positions plus the partial last block span <= 3 blocks of 4.
    assert max(used) <= 3 and used[-1] == 0
    assert run.outputs() == expected([r])


def test_state_slots_limit_running_sequences_and_are_reserved_for_forks() -> None:
    slots = StateSlots(2)
    run = make_run(prefix=False, state_slots=slots)
    requests = [req("a", prompt(1, 5), n=2), req("b", prompt(2, 4)), req("c", prompt(3, 6))]
    for r in requests:
        run.add(r)
    num_forks = 0
    while run.sched.has_unfinished:
        out = run.step()
        states = [s.seq.state_slot for s in out.scheduled if not s.seq.is_finished]
        states += [s.state_slot for s in run.sched.running]
        assert set(states) <= {0, 1}
        assert len({s.state_slot for s in run.sched.running}) == run.sched.num_running
        for parent, child in run.sched.forked:  # the runner copies parent -> child state
            assert child.state_slot not in (-1, parent.state_slot)
            num_forks += 1
    assert [s.seq.request_id for s in run.steps[0].scheduled] == ["a"]  # b waits for a's fork
    assert num_forks == 1
    assert run.outputs() == expected(requests) and slots.num_free == 2


def test_prefill_and_decode_classification() -> None:
    run = make_run(max_num_batched_tokens=5)
    requests = [req("a", prompt(1, 4)), req("b", prompt(2, 1)), req("c", prompt(3, 5))]
    run.run({0: requests})
    rows = [[(s.seq.request_id, s.start_pos, s.num_new_tokens, s.num_samples, s.is_prefill)
             for s in out.scheduled] for out in run.steps[:3]]  # fmt: skip
    assert rows == [
        [("a", 0, 4, 1, True), ("b", 0, 1, 1, True)],  # a one-token prompt is a prefill
        [("a", 4, 1, 1, False), ("b", 1, 1, 1, False), ("c", 0, 3, 0, True)],
        [("a", 5, 1, 1, False), ("b", 2, 1, 1, False), ("c", 3, 2, 1, True)],
    ]
    assert (run.steps[1].num_prefill_tokens, run.steps[1].num_decode_tokens) == (3, 2)
    assert run.outputs() == expected(requests)


# -------------------------------------------------------------- property test
@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict, list[Request], dict]:
    block_size = draw(st.sampled_from([2, 4]))
    chunked = draw(st.booleans())
    shared = prompt(draw(st.integers(0, 5)), 12)
    requests, arrivals = [], {}
    for i in range(draw(st.integers(1, 6))):
        head = shared[: draw(st.integers(0, 12))]
        tail = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if head else 1, max_size=10))
        r = req(
            f"r{i}", head + tail, max_tokens=draw(st.integers(1, 10)), n=draw(st.integers(1, 3))
        )
        requests.append(r)
        arrivals.setdefault(draw(st.integers(0, 6)), []).append(r)
    longest = max(len(r.prompt_ids) + r.sampling.max_tokens for r in requests)
    min_blocks = -(-longest // block_size)
    budget_floor = 2 if chunked else max(len(r.prompt_ids) for r in requests)
    engine = {
        "num_blocks": draw(st.integers(min_blocks, min_blocks + 12)),
        "block_size": block_size,
        "prefix": draw(st.booleans()),
        "max_num_seqs": draw(st.integers(3, 8)),
        "max_num_batched_tokens": draw(st.integers(budget_floor, budget_floor + 24)),
        "enable_chunked_prefill": chunked,
    }
    return engine, requests, arrivals


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_any_schedule_reproduces_the_reference_outputs(workload: tuple) -> None:
    engine, requests, arrivals = workload
    run = make_run(**engine)
    run.run(arrivals)
    assert run.outputs() == expected(requests)
    assert run.bm.num_used_blocks == 0 and run.bm.num_free_blocks == run.bm.num_blocks
    assert not run.bm._seq_hashes  # per-sequence hash records do not leak
