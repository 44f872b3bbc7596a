"""The runner's persistent batch: block tables of the live sequences as rows of one array.

vLLM v1's `InputBatch` in the part that matters on a CPU host: every step the runner
needs the block tables of the step's sequences as one padded (B, max_blocks) int32
array.  Building it per step costs a numpy row copy per sequence (~0.5 us each, 0.1 ms at
batch 256) although a decode step changes almost no table.  `TableRows` keeps each
sequence's table in a row of one array that lives across steps, keyed by sequence id,
and writes only what changed since the last step: nothing for a decode into its own
last block, one entry when a block is appended, the whole row when the table was edited
otherwise (copy-on-write, sliding-window release) or replaced (preemption, fork).  A
step's tables are then one fancy-index gather, whatever the batch.

What changed is read from the table itself, never announced by the scheduler: a
`BlockTable` carries a `version` that is unique and changes on every edit but an append,
so a row that recorded (version, length) at its last sync is exact while both match, and
needs only the new tail when just the length grew.  A table without a version (a plain
list) is recopied every step.  Rows therefore need no bookkeeping from outside to stay
correct; `release` and `clear` only hand rows back early.

Plain numpy, no torch: the runner wraps the gathered arrays into tensors.
"""

from __future__ import annotations

import numpy as np

from infbench.engine.sequence import BlockTable, table_array


class TableRows:
    """One KV group's block tables, one row per live sequence; see the module docstring.

    Invariant: for every row in use, `array[row, :_lengths[row]]` equals the table of
    version `_versions[row]` with released entries (-1) as 0, and the rest of the row is
    0, so a gather of rows padded to the widest table is the step's padded block tables.
    """

    def __init__(self, num_rows: int = 8, width: int = 16) -> None:
        self.array = np.zeros((num_rows, width), dtype=np.int32)  # (rows, max_blocks)
        # Per row: the version and length of the table it holds (-1: none or a plain
        # list), as Python lists for the per-sequence checks and the lengths also as an
        # array for the step's gather.
        self._versions = [-1] * num_rows
        self._lengths = [0] * num_rows
        self._length_array = np.zeros(num_rows, dtype=np.int64)
        self._row_of: dict[int, int] = {}  # seq id -> row
        self._free = list(range(num_rows - 1, -1, -1))  # pop() takes the lowest row

    @property
    def num_rows(self) -> int:
        return self.array.shape[0]

    def row_of(self, seq_id: int) -> int | None:
        return self._row_of.get(seq_id)

    def gather(self, seq_ids: list[int], tables: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, lengths), both (B,) int64: the rows now holding `tables`, and their lengths.

        `seq_ids[b]` owns `tables[b]`; the ids must be distinct.  Rows are synced first,
        so `array[rows]` (or any columns of it) reads the tables.
        """
        # One plain loop with the row state in Python lists: at ~16 stale rows a step
        # (decodes crossing into a new block) this measured faster than checking every
        # row with numpy, whose calls cost ~2 us each here.
        row_of, versions, lengths = self._row_of, self._versions, self._lengths
        rows: list[int] = []
        step_ids: set[int] | None = None
        for seq_id, table in zip(seq_ids, tables, strict=True):
            row = row_of.get(seq_id)
            if (row is None or type(table) is not BlockTable
                    or table.version != versions[row] or len(table) != lengths[row]):
                if row is None:
                    if not self._free and step_ids is None:
                        step_ids = set(seq_ids)
                    row = self._take_row(seq_id, step_ids)
                self._sync(row, table)
            rows.append(row)
        row_array = np.array(rows, dtype=np.int64)
        return row_array, self._length_array[row_array]

    def release(self, seq_id: int) -> None:
        """Hand back the row of a sequence that left the batch (unknown ids are ignored)."""
        row = self._row_of.pop(seq_id, None)
        if row is not None:
            self._clear_row(row)
            self._free.append(row)

    def clear(self) -> None:
        """Hand back every row (a new run: sequence ids start again)."""
        for seq_id in list(self._row_of):
            self.release(seq_id)

    # -------------------------------------------------------------- internals
    def _sync(self, row: int, table: list[int]) -> None:
        old, length = self._lengths[row], len(table)
        version = table.version if type(table) is BlockTable else -1
        if length > self.array.shape[1]:
            self._grow(self.array.shape[0], max(length, 2 * self.array.shape[1]))
        if version >= 0 and version == self._versions[row] and length > old:
            # Same table, blocks appended: write the new tail only.  One block (a decode
            # crossing into a new block) is a scalar write, much cheaper than numpy slicing.
            if length == old + 1:
                self.array[row, old] = max(table[old], 0)
            else:
                self.array[row, old:length] = np.maximum(table_array(table)[old:length], 0)
        else:
            self.array[row, :length] = np.maximum(table_array(table), 0)
            self.array[row, length:old] = 0
        self._versions[row] = version
        self._lengths[row] = length
        self._length_array[row] = length

    def _take_row(self, seq_id: int, step_ids: set[int] | None) -> int:
        if not self._free:
            # Rows of sequences not in this step (finished, preempted or just not
            # scheduled) go back: a later step resyncs them.  Grow while rows stay scarce,
            # so that this sweep runs rarely.
            assert step_ids is not None
            for other in [s for s in self._row_of if s not in step_ids]:
                self.release(other)
            if len(self._free) <= self.num_rows // 4:
                self._grow(2 * self.num_rows, self.array.shape[1])
        row = self._free.pop()
        self._row_of[seq_id] = row
        return row

    def _clear_row(self, row: int) -> None:
        self.array[row, : self._lengths[row]] = 0
        self._versions[row] = -1
        self._lengths[row] = 0
        self._length_array[row] = 0

    def _grow(self, num_rows: int, width: int) -> None:
        old_rows, old_width = self.array.shape
        array = np.zeros((num_rows, width), dtype=np.int32)
        array[:old_rows, :old_width] = self.array
        self.array = array
        self._versions += [-1] * (num_rows - old_rows)
        self._lengths += [0] * (num_rows - old_rows)
        self._length_array = np.concatenate(
            [self._length_array, np.zeros(num_rows - old_rows, dtype=np.int64)])
        self._free = list(range(num_rows - 1, old_rows - 1, -1)) + self._free
