"""Paged KV-cache bookkeeping: block ids, ref counts, prefix hashes, copy-on-write.

Plain Python (deque, dict), no tensors: the runner owns the KV pool and only reads
block tables, slots and the (src, dst) copies this module asks for.

A block id indexes `block_size` token slots of the pool.  Blocks are reference
counted so that forked samples and requests with a common prefix share them.
Prefix caching (vLLM's automatic prefix caching) keys every block that is full of
computed tokens by a chained hash, hash((parent_hash, tokens_of_block)), so a hit
requires the same tokens after the same preceding blocks.  A block whose last
reference goes away stays findable by its hash ("evictable") until the pool runs
out of never-hashed blocks; evictable blocks are then reused least recently freed
first, and reuse drops the hash entry.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from infbench.engine.sequence import BlockTable, Sequence

RELEASED = -1  # block-table entry of a block freed by a sliding window


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks needed for `a` tokens at `b` tokens per block."""
    return -(-a // b)


@dataclass
class _SeqHashes:
    """Chained hashes of a sequence's full blocks, and how many of them were committed."""

    hashes: list[int] = field(default_factory=list)
    num_committed: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0: {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free: deque[int] = deque(range(num_blocks))  # ref 0, no hash
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, hashed; LRU first
        self._num_used = 0
        self._seq_hashes: dict[int, _SeqHashes] = {}

    # ------------------------------------------------------------------ counts
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never-hashed free blocks plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self._num_used

    @property
    def max_seq_blocks(self) -> int:
        """Blocks of context one sequence may reach: the whole pool."""
        return self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by prefix hash (in use or evictable)."""
        return len(self._hash_to_block)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def num_allocated_slots(self) -> int:
        return self._num_used * self.block_size

    def slot(self, seq: Sequence, pos: int) -> int:
        block = seq.block_table[pos // self.block_size]
        if block == RELEASED:
            raise ValueError(f"seq {seq.seq_id}: position {pos} was released by the sliding window")
        return block * self.block_size + pos % self.block_size

    # --------------------------------------------------------------- admission
    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        """Tokens `allocate` would take from the prefix cache for this (unallocated) sequence."""
        return len(self._prefix_hits(seq)) * self.block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        hits = self._prefix_hits(seq)
        num_needed = self._num_blocks_for(seq, len(hits), num_new_tokens) - len(hits)
        # Evictable hits leave the free pool when they are taken.
        num_reclaimed = sum(1 for block in hits if self._ref_counts[block] == 0)
        return num_needed <= self.num_free_blocks - num_reclaimed

    def allocate(self, seq: Sequence, num_new_tokens: int) -> int:
        """First admission (or re-admission after preemption): returns the prefix-hit tokens.

        Blocks cover positions < hits + num_new_tokens, clipped to seq.num_tokens.
        """
        if seq.block_table:
            raise ValueError(f"seq {seq.seq_id} already holds blocks; use append_slots")
        if not self.can_allocate(seq, num_new_tokens):
            raise RuntimeError(f"seq {seq.seq_id}: out of KV blocks (check can_allocate first)")
        hits = self._prefix_hits(seq)
        for block in hits:
            self._incref(block)
        num_hit_tokens = len(hits) * self.block_size
        seq.block_table = BlockTable(hits)
        seq.num_computed_tokens = num_hit_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_hit_tokens
        if self.enable_prefix_caching:  # hit blocks are registered already
            self._seq_hashes.setdefault(seq.seq_id, _SeqHashes()).num_committed = len(hits)
        target = self._num_blocks_for(seq, len(hits), num_new_tokens)
        while len(seq.block_table) < target:
            seq.block_table.append(self._take_free())
        return num_hit_tokens

    def _num_blocks_for(self, seq: Sequence, num_hit_blocks: int, num_new_tokens: int) -> int:
        end = min(num_hit_blocks * self.block_size + num_new_tokens, seq.num_tokens)
        return cdiv(end, self.block_size)

    # ------------------------------------------------------------------ growth
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        if self._fits_own_last_block(seq, num_new_tokens):
            return True
        return self._num_blocks_to_append(seq, num_new_tokens) <= self.num_free_blocks

    def _fits_own_last_block(self, seq: Sequence, num_new_tokens: int) -> bool:
        """The new tokens all go into the table's last block, which no one else holds.

        What almost every sequence of a decode step does, so it is checked first.
        """
        table, start, bs = seq.block_table, seq.num_computed_tokens, self.block_size
        return (start + num_new_tokens <= len(table) * bs and start // bs == len(table) - 1
                and self._ref_counts[table[-1]] == 1)

    def try_append_slots(self, seq: Sequence,
                         num_new_tokens: int) -> list[tuple[int, int]] | None:
        """`append_slots` when `can_append`, else None: one call per sequence per step.

        The scheduler calls this for every running sequence every step; a decode into
        its own unfilled last block (almost every one) is answered by the inline check
        below without a further call.
        """
        table, start, bs = seq.block_table, seq.num_computed_tokens, self.block_size
        if (start + num_new_tokens <= len(table) * bs and start // bs == len(table) - 1
                and self._ref_counts[table[-1]] == 1):  # _fits_own_last_block, inlined
            return []
        if not self.can_append(seq, num_new_tokens):
            return None
        return self.append_slots(seq, num_new_tokens)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Ensure blocks for positions < num_computed + num_new_tokens.

        A shared block about to be written is copied first (copy-on-write): the
        returned (src, dst) pairs must be copied by the runner before the forward.
        """
        if self._fits_own_last_block(seq, num_new_tokens):
            return []
        if not self.can_append(seq, num_new_tokens):
            raise RuntimeError(f"seq {seq.seq_id}: out of KV blocks (check can_append first)")
        table = seq.block_table
        end = seq.num_computed_tokens + num_new_tokens
        copies: list[tuple[int, int]] = []
        for i in self._write_range(seq, end):
            src = table[i]
            if self._ref_counts[src] > 1:
                dst = self._take_free()
                self._decref(src)
                table[i] = dst
                copies.append((src, dst))
        while len(table) * self.block_size < end:
            table.append(self._take_free())
        return copies

    def _write_range(self, seq: Sequence, end: int) -> range:
        """Indices of blocks already in the table that positions [num_computed, end) write."""
        first = seq.num_computed_tokens // self.block_size
        return range(first, min(len(seq.block_table), cdiv(end, self.block_size)))

    def _num_blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        end = seq.num_computed_tokens + num_new_tokens
        num_new = max(0, cdiv(end, self.block_size) - len(seq.block_table))
        num_cow = sum(
            1 for i in self._write_range(seq, end) if self._ref_counts[seq.block_table[i]] > 1
        )
        return num_new + num_cow

    # ----------------------------------------------------------- after a step
    def commit(self, seq: Sequence) -> None:
        """Make every block now full of computed tokens findable by its chained hash.

        Called after every step that computed tokens of `seq`, so it acts only when a
        block filled up since its last call (the scheduler skips the call otherwise).
        """
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        record = self._seq_hashes.get(seq.seq_id)
        if record is None:
            record = self._seq_hashes[seq.seq_id] = _SeqHashes()
        elif record.num_committed >= num_full:
            return  # no block filled up since the last commit (most decode steps)
        self._extend_hashes(seq, record, num_full)
        for i in range(record.num_committed, num_full):
            block, h = seq.block_table[i], record.hashes[i]
            # A duplicate of an already-cached block (two equal prompts computed in the
            # same step) stays private and unhashed; the first one keeps the entry.
            is_new = self._block_hash[block] is None and h not in self._hash_to_block
            if block != RELEASED and is_new:
                self._block_hash[block] = h
                self._hash_to_block[h] = block
        record.num_committed = max(record.num_committed, num_full)

    def free(self, seq: Sequence) -> None:
        # Reverse order: the tail of a prefix is evicted before its head.
        for block in reversed(seq.block_table):
            if block != RELEASED:
                self._decref(block)
        seq.block_table = BlockTable()
        self._seq_hashes.pop(seq.seq_id, None)

    def truncate(self, seq: Sequence, num_tokens: int) -> int:
        """Free the blocks past the first `num_tokens` positions (the slots of rejected
        speculative tokens); returns how many.  Never touches a hashed (committed) block:
        commit only covers computed tokens, which are kept."""
        keep = cdiv(num_tokens, self.block_size)
        table = seq.block_table
        num_freed = 0
        while len(table) > keep:
            block = table.pop()
            if block != RELEASED:
                self._decref(block)
            num_freed += 1
        return num_freed

    def fork(self, parent: Sequence, child: Sequence) -> None:
        if child.block_table:
            raise ValueError(f"fork: child seq {child.seq_id} already holds blocks")
        child.block_table = BlockTable(parent.block_table)
        for block in child.block_table:
            if block != RELEASED:
                self._incref(block)
        record = self._seq_hashes.get(parent.seq_id)
        if record is not None:
            self._seq_hashes[child.seq_id] = _SeqHashes(list(record.hashes), record.num_committed)

    def release_outside_window(self, seq: Sequence, window: int) -> int:
        """Free blocks whose every position is < num_computed_tokens - window.

        Released blocks always form a prefix of the table (the limit only grows while
        a sequence holds blocks), so the scan walks back from the limit to the
        previous release.
        """
        limit = max(0, seq.num_computed_tokens - window) // self.block_size
        num_released = 0
        for i in range(min(limit, len(seq.block_table)) - 1, -1, -1):
            block = seq.block_table[i]
            if block == RELEASED:
                break
            self._decref(block)
            seq.block_table[i] = RELEASED
            num_released += 1
        return num_released

    # -------------------------------------------------------------- internals
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks matching the sequence's leading full blocks (never all its tokens)."""
        if not self.enable_prefix_caching:
            return []
        # At least one token is always computed so the step produces logits.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        record = self._seq_hashes.setdefault(seq.seq_id, _SeqHashes())
        self._extend_hashes(seq, record, max_blocks)
        hits: list[int] = []
        for h in record.hashes[:max_blocks]:
            block = self._hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _extend_hashes(self, seq: Sequence, record: _SeqHashes, num_blocks: int) -> None:
        if len(record.hashes) >= num_blocks:
            return
        tokens, bs = seq.token_ids, self.block_size
        for i in range(len(record.hashes), num_blocks):
            parent = record.hashes[i - 1] if i else None
            record.hashes.append(hash((parent, tuple(tokens[i * bs : (i + 1) * bs]))))

    def _take_free(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            h = self._block_hash[block]
            assert h is not None
            del self._hash_to_block[h]
            self._block_hash[block] = None
        self._ref_counts[block] = 1
        self._num_used += 1
        return block

    def _incref(self, block: int) -> None:
        if self._ref_counts[block] == 0:  # a cached block coming back into use
            del self._evictable[block]
            self._num_used += 1
        self._ref_counts[block] += 1

    def _decref(self, block: int) -> None:
        if self._ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} freed more often than it was referenced")
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            self._num_used -= 1
            if self._block_hash[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)


class StateSlots:
    """Fixed per-sequence states (linear attention, SSM): one slot per running sequence."""

    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"num_slots must be > 0, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free state slot (check num_free first)")
        slot = self._free.popleft()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"state slot {slot} is not allocated")
        self._used.remove(slot)
        self._free.append(slot)
