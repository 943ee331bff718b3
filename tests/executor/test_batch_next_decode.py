"""BatchInputs.next_decode: a decode batch one position on is exactly build_batch's for the advanced
rows, every array equal in values, shape and type: rows in the block of their last position, rows
with a new block, rows whose oldest window block was released; None where a table's width changes."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
from batch_rows import Row

from wicore.executor.batch import BatchInputs, build_batch

BS = 4


def assert_same(got: BatchInputs | None, want: BatchInputs) -> None:
    assert got is not None
    for f in fields(BatchInputs):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f.name
        np.testing.assert_array_equal(a, b, err_msg=f.name)


def rows_at_first_step() -> list[Row]:
    return [
        Row([11], 5, [3, 7], [3, 7], 0),  # next position 6: in block 1 still
        Row([12], 11, [2, 9, 4], [9, 4], 1),  # next 12: starts logical block 3 (a new frame, 8)
        Row([13], 14, [5, 6, 1, 10], [1, 10], 2),  # next 15: in block 3; its window keeps blocks 2..3
    ]


def test_rows_within_their_blocks_advance_by_one_position():
    rows = [rows_at_first_step()[0], rows_at_first_step()[2]]
    nxt = [replace(r, token_ids=[r.token_ids[0] + 10], start=r.start + 1) for r in rows]
    assert_same(build_batch(rows, BS).next_decode(nxt, BS), build_batch(nxt, BS))


def test_a_new_block_and_a_released_window_block_are_written_from_the_row():
    rows = rows_at_first_step()
    first = build_batch(rows, BS)
    nxt = [
        replace(rows[0], token_ids=[21], start=6),
        replace(rows[1], token_ids=[22], start=12, block_table=[2, 9, 4, 8], window_table=[4, 8], window_first=2),
        replace(rows[2], token_ids=[23], start=15),
    ]
    assert_same(first.next_decode(nxt, BS, changed=[1]), build_batch(nxt, BS))


def test_a_table_wider_than_the_batchs_needs_the_batch_built_anew():
    rows = rows_at_first_step()
    first = build_batch(rows, BS)
    grown = replace(rows[1], start=12, block_table=[2, 9, 4, 8], window_table=[4, 8], window_first=2)
    longest = replace(rows[2], start=16, block_table=[5, 6, 1, 10, 12], window_table=[10, 12], window_first=3)
    assert first.next_decode([replace(rows[0], start=6), grown, longest], BS, changed=[1, 2]) is None
    wider_window = replace(grown, window_table=[9, 4, 8], window_first=1)
    assert first.next_decode([replace(rows[0], start=6), wider_window, replace(rows[2], start=15)], BS, changed=[1]) is None
