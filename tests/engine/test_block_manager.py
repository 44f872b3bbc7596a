"""BlockManager: allocation, ref counts, prefix caching, copy-on-write, windows, eviction.

The stateful test drives random allocate/append/commit/fork/free/release sequences
against a model of the physical KV pool (slot -> token written there) and checks
after every operation that the bookkeeping is consistent and that every computed
position of every live sequence still reads its own token: a wrong prefix hit, a
missing copy-on-write or a block reused while referenced would all break that.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from infbench.engine.block_manager import RELEASED, BlockManager, StateSlots
from infbench.engine.request import SamplingParams
from infbench.engine.sequence import Sequence

BS = 4


def make_seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams(max_tokens=64), 0.0)


def admit(bm: BlockManager, seq: Sequence, num_new: int | None = None) -> int:
    """Allocate and compute up to num_new tokens (default: all); returns the hit tokens."""
    num_new = seq.num_tokens if num_new is None else num_new
    hit = bm.allocate(seq, num_new)
    seq.num_computed_tokens += min(num_new, seq.num_tokens - hit)
    bm.commit(seq)
    return hit


def grow(bm: BlockManager, seq: Sequence, token: int) -> list[tuple[int, int]]:
    """Append a sampled token and compute it (one decode step)."""
    seq.output_ids.append(token)
    copies = bm.append_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)
    return copies


def fork_of(parent: Sequence, seq_id: int) -> Sequence:
    child = make_seq(seq_id, parent.prompt_ids)
    child.output_ids = list(parent.output_ids)
    child.num_computed_tokens = parent.num_computed_tokens
    return child


def assert_consistent(bm: BlockManager, seqs: list[Sequence]) -> None:
    refs = Counter(b for s in seqs for b in s.block_table if b != RELEASED)
    for block in range(bm.num_blocks):
        assert bm.ref_count(block) == refs[block], f"block {block}"
    assert all(bm.ref_count(b) > 0 for b in refs)  # no table holds a freed block
    assert bm.num_used_blocks == len(refs)
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    assert bm.num_allocated_slots() == len(refs) * bm.block_size


# --------------------------------------------------------------------- basics
def test_allocate_and_free_return_every_block() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(0, list(range(10)))
    assert bm.can_allocate(seq, 10)
    assert bm.allocate(seq, 10) == 0
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert (bm.num_used_blocks, bm.num_free_blocks, bm.num_allocated_slots()) == (3, 5, 12)
    assert all(bm.ref_count(b) == 1 for b in seq.block_table)
    bm.free(seq)
    assert seq.block_table == []
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 8)


def test_allocate_covers_only_the_chunk_and_clips_to_the_tokens() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(0, list(range(10)))
    bm.allocate(seq, 4)
    assert len(seq.block_table) == 1
    seq.num_computed_tokens = 4
    assert bm.append_slots(seq, 5) == []
    assert len(seq.block_table) == 3  # positions < 9
    short = make_seq(1, [1, 2, 3, 4, 5])
    bm.allocate(short, 100)
    assert len(short.block_table) == 2


def test_slot_math() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(0, list(range(12)))
    seq.block_table = [3, 0, 5]
    assert [bm.slot(seq, p) for p in (0, 3, 4, 5, 9, 11)] == [12, 15, 0, 1, 21, 23]


def test_exhaustion() -> None:
    bm = BlockManager(2, BS)
    big = make_seq(0, list(range(12)))
    assert not bm.can_allocate(big, 12)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(big, 12)
    assert bm.can_allocate(big, 8)  # a chunk that fits
    admit(bm, big, 8)
    assert bm.num_free_blocks == 0
    assert not bm.can_append(big, 1)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.append_slots(big, 1)
    assert_consistent(bm, [big])


# -------------------------------------------------------------- prefix cache
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]  # two blocks


def test_shared_system_prompt_is_stored_once() -> None:
    bm = BlockManager(16, BS)
    a, b = make_seq(0, SYSTEM + [1, 2, 3]), make_seq(1, SYSTEM + [4, 5])
    assert admit(bm, a) == 0 and a.num_cached_tokens == 0
    used = bm.num_used_blocks
    assert bm.num_prefix_hit_tokens(b) == 8
    assert admit(bm, b, 2) == 8
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 10
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.ref_count(x) for x in a.block_table[:2]] == [2, 2]
    assert bm.num_used_blocks == used + 1  # only b's own tail block
    assert_consistent(bm, [a, b])


def test_hash_is_chained_over_preceding_blocks() -> None:
    bm = BlockManager(16, BS)
    admit(bm, make_seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 0]))
    # Block [5, 6, 7, 8] after a different first block, or first: not a hit.
    assert bm.num_prefix_hit_tokens(make_seq(1, [9, 9, 9, 9, 5, 6, 7, 8, 0])) == 0
    assert bm.num_prefix_hit_tokens(make_seq(2, [5, 6, 7, 8, 0])) == 0
    assert bm.num_prefix_hit_tokens(make_seq(3, [1, 2, 3, 4, 9, 9, 9, 9, 0])) == 4
    assert bm.num_prefix_hit_tokens(make_seq(4, [1, 2, 3, 4, 5, 6, 7, 8, 1])) == 8


def test_never_a_full_prompt_hit() -> None:
    bm = BlockManager(16, BS)
    admit(bm, make_seq(0, SYSTEM + [1]))
    same = make_seq(1, SYSTEM)  # every token cached: the last block is recomputed
    assert admit(bm, same) == 4
    assert same.num_computed_tokens == 8 and same.num_cached_tokens == 4


def test_cached_tokens_are_counted_at_first_admission_only() -> None:
    bm = BlockManager(16, BS)
    a = make_seq(0, SYSTEM + [1])
    assert admit(bm, a) == 0
    a.output_ids.append(2)
    bm.free(a)  # preempted by recompute
    a.num_computed_tokens, a.num_preemptions = 0, 1
    assert admit(bm, a) == 8 and a.num_cached_tokens == 0


def test_partial_and_uncomputed_blocks_are_not_cached() -> None:
    bm = BlockManager(16, BS)
    a = make_seq(0, SYSTEM + [1, 2])
    admit(bm, a, 6)  # block 1 holds only 2 computed tokens
    assert bm.num_cached_blocks == 1
    assert bm.num_prefix_hit_tokens(make_seq(1, SYSTEM + [3])) == 4


def test_freed_blocks_stay_findable_until_evicted() -> None:
    bm = BlockManager(4, BS)
    a = make_seq(0, SYSTEM + [1])
    admit(bm, a)
    bm.free(a)
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.num_cached_blocks) == (4, 0, 2)
    # Never-hashed free blocks are used before cached ones are evicted.
    other = make_seq(1, [7, 7, 7, 7, 7])
    admit(bm, other)
    assert bm.num_prefix_hit_tokens(make_seq(2, SYSTEM + [2])) == 8
    bm.free(other)
    # A request that needs the whole pool evicts the cached blocks and drops their hashes.
    hog = make_seq(3, list(range(100, 116)))
    assert bm.can_allocate(hog, 16)
    admit(bm, hog)
    assert bm.num_free_blocks == 0
    assert bm.num_prefix_hit_tokens(make_seq(4, SYSTEM + [2])) == 0
    assert_consistent(bm, [hog])


def test_evictable_hit_counts_against_the_free_pool() -> None:
    bm = BlockManager(3, BS)
    a = make_seq(0, SYSTEM + [1])
    admit(bm, a)
    bm.free(a)
    # 2 hit blocks (evictable) + 2 new blocks > 3: taking the hits leaves only 1 free.
    b = make_seq(1, SYSTEM + list(range(5)))
    assert bm.num_prefix_hit_tokens(b) == 8
    assert not bm.can_allocate(b, 5)
    assert bm.can_allocate(b, 4)


def test_duplicate_blocks_computed_in_the_same_step_stay_private() -> None:
    bm = BlockManager(16, BS)
    a, b = make_seq(0, SYSTEM + [1]), make_seq(1, SYSTEM + [1])
    bm.allocate(a, 9)
    bm.allocate(b, 9)  # no hit yet: nothing committed
    for seq in (a, b):
        seq.num_computed_tokens = 9
        bm.commit(seq)
    assert bm.num_cached_blocks == 2
    bm.free(b)
    bm.free(a)
    assert bm.num_free_blocks == 16 and bm.num_prefix_hit_tokens(make_seq(2, SYSTEM + [1])) == 8


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    admit(bm, make_seq(0, SYSTEM + [1]))
    b = make_seq(1, SYSTEM + [1])
    assert bm.num_prefix_hit_tokens(b) == 0 and admit(bm, b) == 0
    assert bm.num_cached_blocks == 0


# ------------------------------------------------------------ copy-on-write
def test_copy_on_write_after_fork() -> None:
    bm = BlockManager(8, BS)
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    admit(bm, parent)
    parent.output_ids.append(7)  # sampled at the end of the prompt
    child = fork_of(parent, 1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.ref_count(b) for b in parent.block_table] == [2, 2]
    shared_tail = parent.block_table[1]
    copies = bm.append_slots(parent, 1)  # writes position 6 in the shared block
    assert copies == [(shared_tail, parent.block_table[1])]
    assert parent.block_table[1] != shared_tail and bm.ref_count(shared_tail) == 1
    assert bm.append_slots(child, 1) == []  # now the only owner: written in place
    assert child.block_table[1] == shared_tail
    assert bm.ref_count(parent.block_table[0]) == 2  # full prompt block stays shared
    assert_consistent(bm, [parent, child])


def test_fork_at_a_block_boundary_needs_no_copy() -> None:
    bm = BlockManager(8, BS)
    parent = make_seq(0, SYSTEM)
    admit(bm, parent)
    parent.output_ids.append(1)
    child = fork_of(parent, 1)
    bm.fork(parent, child)
    assert bm.append_slots(parent, 1) == [] and bm.append_slots(child, 1) == []
    assert parent.block_table[2] != child.block_table[2]
    assert_consistent(bm, [parent, child])


def test_can_append_counts_the_copy() -> None:
    bm = BlockManager(2, BS)
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    admit(bm, parent)
    parent.output_ids.append(7)
    child = fork_of(parent, 1)
    bm.fork(parent, child)
    assert bm.num_free_blocks == 0
    assert not bm.can_append(parent, 1)  # would need a block for the copy
    bm.free(child)
    assert bm.can_append(parent, 1) and bm.append_slots(parent, 1) == []


def test_try_append_slots_is_can_append_then_append_slots() -> None:
    bm = BlockManager(2, BS)
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    admit(bm, parent)
    parent.output_ids.append(7)
    child = fork_of(parent, 1)
    bm.fork(parent, child)
    before = (list(parent.block_table), bm.num_free_blocks)
    assert bm.try_append_slots(parent, 1) is None  # the copy needs a block: nothing changes
    assert (list(parent.block_table), bm.num_free_blocks) == before
    bm.free(child)
    assert bm.try_append_slots(parent, 1) == []  # its own last block now: written in place
    parent.num_computed_tokens += 1
    parent.output_ids.append(8)
    assert bm.try_append_slots(parent, 1) == []  # position 7, still the last block
    parent.num_computed_tokens += 1
    assert bm.try_append_slots(parent, 1) is None  # position 8 needs a third block: none free
    assert_consistent(bm, [parent])


# ---------------------------------------------------------- sliding window
def test_release_outside_window() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(0, list(range(20)))
    admit(bm, seq)
    table = list(seq.block_table)
    # Positions < 20 - 8 = 12 cannot be read again: blocks 0, 1, 2.
    assert bm.release_outside_window(seq, 8) == 3
    assert seq.block_table == [RELEASED] * 3 + table[3:]
    assert bm.num_used_blocks == 2
    assert bm.release_outside_window(seq, 8) == 0
    with pytest.raises(ValueError, match="sliding window"):
        bm.slot(seq, 11)
    assert bm.slot(seq, 12) == table[3] * BS
    grow(bm, seq, 1)
    assert bm.release_outside_window(seq, 8) == 0  # 21 - 8 = 13: block 3 still read
    assert_consistent(bm, [seq])
    bm.free(seq)
    assert bm.num_free_blocks == 8


# -------------------------------------------------------------- state slots
def test_state_slots() -> None:
    slots = StateSlots(2)
    a, b = slots.allocate(), slots.allocate()
    assert {a, b} == {0, 1} and slots.num_free == 0
    with pytest.raises(RuntimeError):
        slots.allocate()
    slots.free(a)
    assert slots.num_free == 1
    with pytest.raises(ValueError):
        slots.free(a)


# ------------------------------------------------------------ stateful test
PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7], [])
NUM_BLOCKS = 12


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BS)
        self.seqs: list[Sequence] = []
        self.kv: dict[int, int] = {}  # physical slot -> token written there
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _compute(self, seq: Sequence, num_new: int, token: int) -> None:
        start = seq.num_computed_tokens
        for pos in range(start, start + num_new):
            self.kv[self.bm.slot(seq, pos)] = seq.token_ids[pos]
        seq.num_computed_tokens += num_new
        self.bm.commit(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.output_ids.append(token)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 2), max_size=6),
        chunk=st.integers(1, 16),
        token=st.integers(0, 2),
    )
    def allocate(self, prefix: list[int], tail: list[int], chunk: int, token: int) -> None:
        seq = make_seq(self._new_id(), prefix + tail or [0])
        if not self.bm.can_allocate(seq, chunk):
            return
        hit = self.bm.allocate(seq, chunk)
        assert hit % BS == 0 and hit < seq.num_tokens
        assert seq.num_computed_tokens == hit == seq.num_cached_tokens
        self.seqs.append(seq)
        self._compute(seq, min(chunk, seq.num_tokens - hit), token)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data: st.DataObject, token: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        num_new = data.draw(st.integers(1, seq.num_tokens - seq.num_computed_tokens))
        if not self.bm.can_append(seq, num_new):
            return
        for src, dst in self.bm.append_slots(seq, num_new):
            assert self.bm.ref_count(src) >= 1 and self.bm.ref_count(dst) == 1
            for off in range(BS):
                if src * BS + off in self.kv:
                    self.kv[dst * BS + off] = self.kv[src * BS + off]
        self._compute(seq, num_new, token)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.seqs))
        child = fork_of(parent, self._new_id())
        self.bm.fork(parent, child)
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), window=st.integers(1, 12))
    def release(self, data: st.DataObject, window: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.release_outside_window(seq, window)
        # Released blocks form a prefix that covers every block entirely before the limit.
        is_released = [block == RELEASED for block in seq.block_table]
        num_released = sum(is_released)
        assert is_released == [True] * num_released + [False] * (len(is_released) - num_released)
        assert num_released >= max(0, seq.num_computed_tokens - window) // BS

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        assert_consistent(self.bm, self.seqs)

    @invariant()
    def every_computed_position_reads_its_token(self) -> None:
        for seq in self.seqs:
            assert len(seq.block_table) * BS >= seq.num_computed_tokens
            tokens = seq.token_ids
            for pos in range(seq.num_computed_tokens):
                if seq.block_table[pos // BS] != RELEASED:
                    assert self.kv[self.bm.slot(seq, pos)] == tokens[pos], (seq.seq_id, pos)


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManagerMachine = BlockManagerMachine.TestCase
