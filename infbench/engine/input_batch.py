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

    Invariant: for every row in use, `array[row, :length[row]]` equals the table of
    version `version[row]` with released entries (-1) as 0, and the rest of the row is 0,
    so a gather of rows padded to the widest table is the step's padded block tables.
    """

    def __init__(self, num_rows: int = 8, width: int = 16) -> None:
        self.array = np.zeros((num_rows, width), dtype=np.int32)  # (rows, max_blocks)
        self._version = np.full(num_rows, -1, dtype=np.int64)  # -1: holds no table
        self._length = np.zeros(num_rows, dtype=np.int64)
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
        row_of = self._row_of
        rows = np.array([row_of.get(i, -1) for i in seq_ids], dtype=np.int64)
        versions = np.array([t.version if type(t) is BlockTable else -1 for t in tables],
                            dtype=np.int64)
        lengths = np.array([len(t) for t in tables], dtype=np.int64)
        # Row -1 reads the last row's state, but `rows < 0` marks it stale regardless.
        stale = ((rows < 0) | (versions < 0) | (self._version[rows] != versions)
                 | (self._length[rows] != lengths))
        if stale.any():
            step_ids: set[int] | None = None
            for b in np.flatnonzero(stale).tolist():
                row = int(rows[b])
                if row < 0:
                    if not self._free and step_ids is None:
                        step_ids = set(seq_ids)
                    row = self._take_row(seq_ids[b], step_ids)
                    rows[b] = row
                self._sync(row, tables[b], int(versions[b]), int(lengths[b]))
        return rows, lengths

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
    def _sync(self, row: int, table: list[int], version: int, length: int) -> None:
        old = int(self._length[row])
        if length > self.array.shape[1]:
            self._grow(self.array.shape[0], max(length, 2 * self.array.shape[1]))
        if version >= 0 and version == self._version[row] and length > old:
            # Same table, blocks appended: write the new tail only.  One block (a decode
            # crossing into a new block) is a scalar write, much cheaper than numpy slicing.
            if length == old + 1:
                self.array[row, old] = max(table[old], 0)
            else:
                self.array[row, old:length] = np.maximum(table_array(table)[old:length], 0)
        else:
            self.array[row, :length] = np.maximum(table_array(table), 0)
            self.array[row, length:old] = 0
        self._version[row] = version
        self._length[row] = length

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
        self.array[row, : int(self._length[row])] = 0
        self._version[row] = -1
        self._length[row] = 0

    def _grow(self, num_rows: int, width: int) -> None:
        old_rows, old_width = self.array.shape
        array = np.zeros((num_rows, width), dtype=np.int32)
        array[:old_rows, :old_width] = self.array
        self.array = array
        self._version = np.concatenate([self._version, np.full(num_rows - old_rows, -1)])
        self._length = np.concatenate([self._length, np.zeros(num_rows - old_rows, np.int64)])
        self._free = list(range(num_rows - 1, old_rows - 1, -1)) + self._free
