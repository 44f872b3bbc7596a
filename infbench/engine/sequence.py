"""One generation stream: its tokens, KV block table, progress and timestamps.

A `Sequence` is the unit the scheduler and block manager work on (vLLM's
`Request` in v1, nano-vllm's `Sequence`).  Progress is a single counter,
`num_computed_tokens`: the scheduler gives each sequence the next tokens whose KV
is not yet in the cache, so prefill, chunked prefill, decode and recompute after
preemption are all the same operation.  A request with `n > 1` starts as one
sequence that forks into `n` at the end of its prompt, sharing the prompt's blocks.

The host loop must not do O(context) work per decode step (benchmarks/host_loop.py
measures it): `token_ids` is one list extended by the new output tokens instead of
prompt + output rebuilt per call, and a `BlockTable` keeps a numpy copy of itself that
only the entries changed since the last read are written into.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

import numpy as np

from infbench.engine.request import Request, SamplingParams

# Versions of block tables: unique in the process, so a (version, length) pair read from
# a table identifies its content even after the table object is gone.
_table_versions = itertools.count()


class BlockTable(list[int]):
    """A block table (a list of block ids) with an incrementally updated int64 array copy.

    The block manager appends blocks and overwrites single entries (copy-on-write,
    sliding-window release); `as_array` copies only entries from the first one written
    since its last call, so a decode step that adds no block copies nothing.  Any other
    in-place change (pop, insert, slice assignment, ...) recopies the whole table.

    `version` serves copies kept elsewhere (the runner's persistent batch): it is unique
    per table and changes on every edit other than appending, so a copy that recorded
    (version, len) at its last sync is still valid while both are unchanged, and needs
    only the new tail when just the length grew.
    """

    __slots__ = ("_array", "_num_synced", "version")

    def __init__(self, blocks: Iterable[int] = ()) -> None:
        super().__init__(blocks)
        self._array = np.empty(max(16, 2 * len(self)), dtype=np.int64)
        self._num_synced = 0  # entries [0, _num_synced) of _array equal the list's
        self.version = next(_table_versions)

    def as_array(self) -> np.ndarray:
        """The table as an int64 array view (valid until the table next changes)."""
        n = len(self)
        if self._num_synced < n:
            if n > self._array.shape[0]:
                grown = np.empty(2 * n, dtype=np.int64)
                grown[: self._num_synced] = self._array[: self._num_synced]
                self._array = grown
            self._array[self._num_synced : n] = self[self._num_synced : n]
            self._num_synced = n
        return self._array[:n]

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self.version = next(_table_versions)
        if isinstance(index, int):
            index = index + len(self) if index < 0 else index
            self._num_synced = min(self._num_synced, index)
        else:
            self._num_synced = 0

    def _forget(self) -> None:
        self._num_synced = 0
        self.version = next(_table_versions)

    def __reduce__(self) -> tuple[type[BlockTable], tuple[list[int]]]:
        # copy, deepcopy and pickle build a new table with a version of its own: two
        # tables sharing a version could diverge by appends that a copy would not see.
        return (BlockTable, (list(self),))

    # Mutators that can move or drop existing entries: recopy everything on the next read.
    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._forget()

    def __iadd__(self, other: Iterable[int]) -> BlockTable:  # type: ignore[override, misc]
        self.extend(other)
        return self

    def __imul__(self, n: SupportsIndex) -> BlockTable:
        super().__imul__(n)
        self._forget()
        return self

    def pop(self, index: SupportsIndex = -1) -> int:
        value = super().pop(index)
        self._forget()
        return value

    def insert(self, index: SupportsIndex, value: int) -> None:
        super().insert(index, value)
        self._forget()

    def remove(self, value: int) -> None:
        super().remove(value)
        self._forget()

    def clear(self) -> None:
        super().clear()
        self._forget()

    def reverse(self) -> None:
        super().reverse()
        self._forget()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._forget()


def table_array(table: list[int]) -> np.ndarray:
    """A block table as int64 array: incremental for a BlockTable, a full copy otherwise."""
    if isinstance(table, BlockTable):
        return table.as_array()
    return np.asarray(table, dtype=np.int64)


class SeqStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(eq=False)
class Sequence:
    """Mutable bookkeeping of one sample; identity (not value) equality."""

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    arrival_s: float
    n: int = 1  # samples still to fork from this sequence at prompt end
    sample_index: int = 0
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_table: list[int] = field(default_factory=BlockTable)  # -1: released by a window
    group_tables: dict[int, list[int]] = field(default_factory=dict)  # KV groups 1.. (kv_groups)
    token_times_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None  # length | stop | eos
    state_slot: int = -1  # constant-state schemes (linear attention, SSM)
    # prompt_ids + output_ids, extended as output_ids grows (see token_ids)
    _tokens: list[int] = field(init=False, repr=False, default_factory=list)
    # the (prompt_ids, output_ids) lists _tokens was built from: references, not ids, so
    # that a replaced list can never be mistaken for a new one at the same address
    _tokens_of: tuple[list[int], list[int]] = field(init=False, repr=False, default=([], []))

    def __post_init__(self) -> None:
        self._rebuild_tokens()

    def _rebuild_tokens(self) -> None:
        self._tokens = self.prompt_ids + self.output_ids
        self._tokens_of = (self.prompt_ids, self.output_ids)

    @classmethod
    def from_request(cls, request: Request, seq_id: int) -> Sequence:
        return cls(
            seq_id=seq_id,
            request_id=request.request_id,
            prompt_ids=list(request.prompt_ids),
            sampling=request.sampling,
            arrival_s=request.arrival_s,
            n=request.n,
        )

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output tokens; amortized O(1) per call.  Read it, never mutate it.

        output_ids is append-only: the list is extended by the tokens appended since the
        last call.  Replacing prompt_ids or output_ids (or shrinking output_ids) rebuilds it.
        """
        tokens, out = self._tokens, self.output_ids
        num_out = len(tokens) - len(self.prompt_ids)
        prompt_of, out_of = self._tokens_of
        if prompt_of is not self.prompt_ids or out_of is not out or num_out > len(out):
            self._rebuild_tokens()
        elif num_out < len(out):
            tokens.extend(out[num_out:])
        return self._tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED
