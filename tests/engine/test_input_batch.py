"""The persistent batch (engine/input_batch.TableRows) against the tables it mirrors.

Every check compares the rows with the tables themselves after edits of every kind the
block manager makes (appends, copy-on-write and window-release overwrites, replaced
tables after preemption or fork), sequences joining and leaving, and rows running out.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from infbench.engine.input_batch import TableRows
from infbench.engine.sequence import BlockTable


def assert_rows_mirror(rows_obj: TableRows, seq_ids: list[int],
                       tables: list[list[int]]) -> np.ndarray:
    """Gather, then check each row is its table (released -1 as 0) followed by zeros."""
    rows, lengths = rows_obj.gather(seq_ids, tables)
    assert len(set(rows.tolist())) == len(rows), "two sequences share a row"
    assert lengths.tolist() == [len(t) for t in tables]
    for row, table in zip(rows.tolist(), tables, strict=True):
        want = [max(b, 0) for b in table]
        got = rows_obj.array[row]
        assert got[: len(table)].tolist() == want
        assert not got[len(table):].any(), "padding past the table must be 0"
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_rows_follow_random_edits_joins_and_leaves(seed: int) -> None:
    rng = random.Random(seed)
    rows_obj = TableRows(num_rows=2, width=2)  # small: rows and width must grow
    live: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(400):
        op = rng.randrange(10)
        if op == 0 or not live:  # a sequence joins
            live[next_id] = BlockTable(rng.randrange(100) for _ in range(rng.randrange(0, 6)))
            next_id += 1
        elif op == 1:  # one leaves (finished); its row may or may not be released
            sid = rng.choice(list(live))
            del live[sid]
            if rng.random() < 0.5:
                rows_obj.release(sid)
        else:
            sid = rng.choice(list(live))
            table = live[sid]
            kind = rng.randrange(8)
            if kind <= 2:  # decode into a new block (the common edit)
                table.append(rng.randrange(100))
            elif kind == 3 and table:  # copy-on-write or sliding-window release
                table[rng.randrange(len(table))] = rng.choice([-1, rng.randrange(100)])
            elif kind == 4:  # preemption or fork: a new table object
                live[sid] = BlockTable(rng.randrange(100) for _ in range(rng.randrange(0, 4)))
            elif kind == 5 and table:  # an edit that shortens the table
                table.pop()
            elif kind == 6:  # a plain list (no version): recopied every step
                live[sid] = [rng.randrange(100) for _ in range(rng.randrange(0, 4))]
            else:
                table.extend(rng.randrange(100) for _ in range(rng.randrange(1, 40)))
        # A step schedules a random subset of the live sequences, in random order.
        ids = [s for s in live if rng.random() < 0.8]
        rng.shuffle(ids)
        assert_rows_mirror(rows_obj, ids, [live[s] for s in ids])
    assert rows_obj.array.shape[1] >= 40, "width should have grown"


def test_rows_are_reused_without_resyncing_unchanged_tables() -> None:
    rows_obj = TableRows(num_rows=4, width=8)
    tables: list[list[int]] = [BlockTable([1, 2]), BlockTable([3]), BlockTable([4, -1, 5])]
    first = assert_rows_mirror(rows_obj, [10, 11, 12], tables)
    # An unchanged table must not be rewritten: scribble on its row and read it back.
    rows_obj.array[first[0], 0] = 99
    rows, _ = rows_obj.gather([10, 11, 12], tables)
    assert rows.tolist() == first.tolist() and rows_obj.array[first[0], 0] == 99
    rows_obj.array[first[0], 0] = 1
    tables[1].append(7)  # appended: only the tail is written
    tables[2][1] = 6  # overwritten: the whole row
    assert (assert_rows_mirror(rows_obj, [10, 11, 12], tables) == first).all()


def test_a_copied_table_never_passes_for_the_original() -> None:
    rows_obj = TableRows()
    table = BlockTable([1, 2, 3])
    assert_rows_mirror(rows_obj, [0], [table])
    twin = copy.copy(table)  # same content now, but it may diverge by appends
    assert isinstance(twin, BlockTable) and twin.version != table.version
    table.append(4)
    twin.pop()
    twin.extend([8, 9])
    assert_rows_mirror(rows_obj, [0], [twin])  # same id, same length as table: resynced


def test_running_out_of_rows_evicts_sequences_outside_the_step() -> None:
    rows_obj = TableRows(num_rows=2, width=4)
    a, b, c = BlockTable([1]), BlockTable([2]), BlockTable([3])
    assert_rows_mirror(rows_obj, [0, 1], [a, b])
    assert_rows_mirror(rows_obj, [2], [c])  # no free row: 0 and 1 are not in this step
    assert rows_obj.row_of(0) is None and rows_obj.row_of(1) is None
    assert_rows_mirror(rows_obj, [0, 1, 2], [a, b, c])  # they come back, resynced
    assert rows_obj.num_rows >= 3
    rows_obj.clear()
    assert all(rows_obj.row_of(s) is None for s in range(3)) and not rows_obj.array.any()
