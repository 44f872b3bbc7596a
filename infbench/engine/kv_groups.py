"""Per-layer-group KV pools for models that mix windowed and full attention layers.

vLLM's hybrid KV-cache allocator in its simplest form: the KV-owning layers are
grouped by window (None = full attention; a chunked layer's span is its chunk,
`LayerSpec.kv_span`: its queries never look behind their chunk's start, so it frees
behind the chunk like a window of that size), each group has its own pool of blocks
(same block size, its own num_blocks and tensors) and each sequence one block
table per group.  A windowed group frees the blocks behind its window, a full
group keeps the whole context, so a sliding model with global layers holds
min(context, window) tokens in its windowed layers, as the analytic model counts.

Group 0 is the sequence's `block_table`; groups 1.. live in `seq.group_tables`.
`GroupedBlockManager` runs one plain `BlockManager` per group by swapping the
group's table into `seq.block_table` around each call, so a single-group model
never reaches this module.  Prefix caching is off for several groups.  Block ids
leave this module only as copy-on-write pairs, in one id space where group g's
block b is `offsets[g] + b` (`KVCache.copy_blocks` splits them back).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from infbench.core.config import EngineConfig, ModelConfig
from infbench.core.errors import DoesNotFitError
from infbench.engine.block_manager import RELEASED, BlockManager
from infbench.engine.sequence import Sequence


def kv_group_windows(cfg: ModelConfig) -> list[int | None]:
    """Windows of the KV groups (a window or a chunk: `LayerSpec.kv_span`): full attention
    (None) first, then windows ascending."""
    windows = {spec.kv_span for spec in cfg.layers() if spec.has_kv_cache}
    return sorted(windows, key=lambda w: -1 if w is None else w)


def layer_groups(cfg: ModelConfig) -> dict[int, int]:
    """KV-owning layer index -> its group (a CLA reader uses its `kv_source`'s group)."""
    windows = kv_group_windows(cfg)
    return {spec.index: windows.index(spec.kv_span)
            for spec in cfg.layers() if spec.has_kv_cache}


def window_blocks_per_seq(window: int, engine: EngineConfig) -> int:
    """Blocks one sequence can ever hold in a windowed group: the window plus one chunk."""
    return math.ceil((window + engine.max_num_batched_tokens) / engine.block_size) + 1


def plan_group_blocks(cfg: ModelConfig, engine: EngineConfig, group_bytes_per_token: list[int],
                      budget: int, weight_bytes: int, max_tokens_needed: int | None,
                      min_tokens: int) -> list[int]:
    """Blocks per group for a byte budget: each group gets what it can ever hold.

    A full group may hold the whole context of every sequence (`max_tokens_needed`
    when the workload is known); a windowed group at most `window_blocks_per_seq`
    per running sequence.  Every group first gets room for one sequence of
    `min_tokens`; the rest of the budget is shared in the ratio in which one
    longest sequence uses the groups, and what a capped group leaves goes to the others.
    """
    bs = engine.block_size
    windows = kv_group_windows(cfg)
    full_seq = math.ceil(cfg.max_seq_len / bs)
    per_seq = [full_seq if w is None else min(full_seq, window_blocks_per_seq(w, engine))
               for w in windows]
    total_cap = math.ceil(max_tokens_needed / bs) + 1 if max_tokens_needed is not None else None
    caps: list[int | None] = []  # None: no cap (the budget decides)
    for w, p in zip(windows, per_seq, strict=True):
        cap = None if w is None else engine.max_num_seqs * p + 1
        if total_cap is not None:
            cap = total_cap if cap is None else min(cap, total_cap)
        caps.append(cap)
    need = [min(math.ceil(min_tokens / bs), p) for p in per_seq]
    block_bytes = [b * bs for b in group_bytes_per_token]
    need_bytes = sum(n * b for n, b in zip(need, block_bytes, strict=True))
    if need_bytes > budget:
        raise DoesNotFitError(
            f"model {cfg.name!r}: weights ({weight_bytes / 1e9:.2f} GB) plus the KV cache of one "
            f"sequence of {min_tokens} tokens ({need_bytes / 1e9:.3f} GB over {len(windows)} "
            f"layer groups) do not fit the KV budget engine.kv_cache_memory="
            f"{engine.kv_cache_memory} ({budget / 1e9:.3f} GB); lower the lengths or raise "
            "the budget")
    scale = (budget - need_bytes) / sum(p * b for p, b in zip(per_seq, block_bytes, strict=True))
    num = [n + math.floor(scale * p) for n, p in zip(need, per_seq, strict=True)]
    num = [n if c is None else min(n, c) for n, c in zip(num, caps, strict=True)]
    left = budget - sum(n * b for n, b in zip(num, block_bytes, strict=True))
    for g, (c, b) in enumerate(zip(caps, block_bytes, strict=True)):  # full groups first
        more = left // b if c is None else min(c - num[g], left // b)
        num[g] += more
        left -= more * b
    return num


class GroupedBlockManager:
    """The BlockManager interface the scheduler uses, over one BlockManager per group."""

    def __init__(self, num_blocks: list[int], block_size: int, windows: list[int | None],
                 engine: EngineConfig) -> None:
        if len(num_blocks) != len(windows) or len(windows) < 2:
            raise ValueError(f"need one block count per group (>= 2): {num_blocks}, {windows}")
        self.groups = [BlockManager(n, block_size, enable_prefix_caching=False)
                       for n in num_blocks]
        self.windows = windows
        self.block_size = block_size
        self.enable_prefix_caching = False
        self.offsets = [sum(num_blocks[:g]) for g in range(len(num_blocks))]
        self._per_seq = [None if w is None else window_blocks_per_seq(w, engine)
                         for w in windows]

    # ------------------------------------------------------------------ counts
    @property
    def num_blocks(self) -> int:
        return sum(bm.num_blocks for bm in self.groups)

    @property
    def max_seq_blocks(self) -> int:
        """Blocks of context one sequence may reach (a windowed group never limits it)."""
        limits = [bm.num_blocks for bm, p in zip(self.groups, self._per_seq, strict=True)
                  if p is None or bm.num_blocks < p]
        return min(limits) if limits else 1 << 62

    @property
    def num_free_blocks(self) -> int:
        return sum(bm.num_free_blocks for bm in self.groups)

    @property
    def num_used_blocks(self) -> int:
        return sum(bm.num_used_blocks for bm in self.groups)

    def group_used_blocks(self) -> list[int]:
        return [bm.num_used_blocks for bm in self.groups]

    def slot(self, seq: Sequence, pos: int) -> int:
        return self.groups[0].slot(seq, pos)

    def tables(self, seq: Sequence) -> list[list[int]]:
        """The sequence's block table of every group (group 0 is seq.block_table)."""
        return [seq.block_table] + [seq.group_tables.get(g, []) for g in range(1, len(self.groups))]

    # --------------------------------------------------------------- delegation
    @contextmanager
    def _as_group(self, seq: Sequence, g: int) -> Iterator[BlockManager]:
        """Swap group g's table into seq.block_table for one BlockManager call."""
        if g == 0:
            yield self.groups[0]
            return
        own = seq.block_table
        seq.block_table = seq.group_tables.get(g, [])
        try:
            yield self.groups[g]
        finally:
            seq.group_tables[g] = seq.block_table
            seq.block_table = own

    def _all(self, seq: Sequence, method: str, *args: int) -> list[Any]:
        out: list[Any] = []
        for g in range(len(self.groups)):
            with self._as_group(seq, g) as bm:
                out.append(getattr(bm, method)(seq, *args))
        return out

    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        return 0

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return all(self._all(seq, "can_allocate", num_new_tokens))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> int:
        if not self.can_allocate(seq, num_new_tokens):
            raise RuntimeError(f"seq {seq.seq_id}: out of KV blocks (check can_allocate first)")
        self._all(seq, "allocate", num_new_tokens)
        return 0

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return all(self._all(seq, "can_append", num_new_tokens))

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Per-group copy-on-write pairs, as ids offset into the groups' joint id space."""
        if not self.can_append(seq, num_new_tokens):
            raise RuntimeError(f"seq {seq.seq_id}: out of KV blocks (check can_append first)")
        copies = self._all(seq, "append_slots", num_new_tokens)
        return [(off + s, off + d) for off, pairs in zip(self.offsets, copies, strict=True)
                for s, d in pairs]

    def try_append_slots(self, seq: Sequence,
                         num_new_tokens: int) -> list[tuple[int, int]] | None:
        """`append_slots` when `can_append`, else None (BlockManager.try_append_slots)."""
        if not self.can_append(seq, num_new_tokens):
            return None
        return self.append_slots(seq, num_new_tokens)

    def commit(self, seq: Sequence) -> None:
        """After a step: windowed groups free the blocks behind their windows."""
        self.release_outside_window(seq)

    def release_outside_window(self, seq: Sequence, window: int | None = None) -> int:
        """Free each windowed group's blocks behind its own window (`window` only widens it)."""
        released = 0
        for g, w in enumerate(self.windows):
            if w is not None:
                with self._as_group(seq, g) as bm:
                    released += bm.release_outside_window(seq, max(w, window or 0))
        return released

    def free(self, seq: Sequence) -> None:
        self._all(seq, "free")

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for g in range(len(self.groups)):
            with self._as_group(parent, g) as bm, self._as_group(child, g):
                bm.fork(parent, child)

    def used_slots(self, running: list[Sequence]) -> int:
        """Token slots holding live KV over all groups (see engine.used_slots)."""
        bs = self.block_size
        total = 0
        for g, bm in enumerate(self.groups):
            holes: dict[int, int] = {}
            for seq in running:
                table = self.tables(seq)[g]
                if table and table[-1] != RELEASED:
                    fill = seq.num_computed_tokens - (len(table) - 1) * bs
                    holes[table[-1]] = bs - min(max(fill, 0), bs)
            total += bm.num_used_blocks * bs - sum(holes.values())
        return total
