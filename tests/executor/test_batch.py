"""build_batch's arrays for the paged attention (graph/paged_attention.py): packed row starts,
the tokens already cached (in the window group: from the row's first window block), the window
group's blocks at their logical index, and the host-side bounds."""

from __future__ import annotations

import numpy as np
import pytest
from batch_rows import Row

from wicore.executor.batch import build_batch
from wicore.graph import io

BS = 4


def test_decode_rows_of_a_sliding_window_engine():
    """Two decode rows: one at position 13 whose window group released logical blocks 0 and 1
    (its table lists blocks 2 and 3), one at position 5 with nothing released."""
    rows = [Row([7], 13, [1, 2, 3, 4], [9, 10], 2, 1), Row([8], 5, [5, 6], [11, 12], 0, 1)]
    b = build_batch(rows, BS)
    assert b.cumulative_seqlens.tolist() == [0, 1, 2] and b.cumulative_seqlens.dtype.name == "int32"
    assert b.past_seqlens.tolist() == [13, 5] and b.past_seqlens.dtype.name == "int32"
    assert b.window_past_seqlens.tolist() == [13 - 2 * BS, 5] and b.window_past_seqlens.dtype.name == "int32"
    sink = io.SINK_BLOCK
    assert b.window_block_tables.tolist() == [[9, 10], [11, 12]]
    assert b.window_slot_mapping.tolist() == [[10 * BS + 1], [12 * BS + 1]]
    assert b.attention_bounds.tolist() == [1, 14] and b.window_attention_bounds.tolist() == [1, 6]
    assert b.block_tables.tolist() == [[1, 2, 3, 4], [5, 6, sink, sink]]
    # what the paged graphs' sliding layers read: the window blocks at their logical index
    assert b.window_logical_tables.tolist() == [[sink, sink, 9, 10], [11, 12, sink, sink]]


def test_padded_rows_reach_only_the_sink_past_their_blocks():
    """A 2-token row batched with a 6-token one is padded to 6 tokens: the paged op reads (for
    the padding's own queries) up to logical block (start + 6 - 1) // BS, so the tables reach
    that far, with the sink block where the row has none; the padding writes to the sink."""
    rows = [Row([1, 2, 3, 4, 5, 6], 0, [3, 4], [3, 4], 0, 1), Row([7, 8], 6, [5, 6], [7, 8], 0, 1)]
    b = build_batch(rows, BS)
    assert b.cumulative_seqlens.tolist() == [0, 6, 12]
    assert b.past_seqlens.tolist() == [0, 6] and b.window_past_seqlens.tolist() == [0, 6]
    assert b.attention_bounds.tolist() == [6, 12]
    sink = io.SINK_BLOCK
    assert b.block_tables.tolist() == [[3, 4, sink], [5, 6, sink]]
    assert b.window_block_tables.tolist() == [[3, 4, sink], [7, 8, sink]]
    assert b.window_logical_tables.tolist() == [[3, 4, sink], [7, 8, sink]]
    assert b.slot_mapping[1].tolist() == [6 * BS + 2, 6 * BS + 3] + [sink * BS] * 4


MIXED_ROWS = [
    Row([5, 6, 7], 5, [7, 2], [7, 2], 0, 3),
    Row([9], 0, [3], [3], 0, 1),
    Row([1, 2], 9, [4, 5, 6], [5, 6], 1, 2),
    Row([8, 8, 8], 0, [1], [1], 0, 1),
]


def test_a_micro_batch_of_rows_is_the_batch_those_rows_make_alone():
    whole = build_batch(MIXED_ROWS, block_size=BS)
    part = whole.rows(2, 4)
    alone = build_batch(MIXED_ROWS[2:4], block_size=BS)  # as long as the batch's longest row: the same padding
    for name, array in vars(alone).items():
        got = getattr(part, name)
        if name in ("block_tables", "window_block_tables", "window_logical_tables"):
            got = got[:, : array.shape[1]]  # the micro-batch keeps the batch's width: sink blocks past its own
            assert (getattr(part, name)[:, array.shape[1] :] == io.SINK_BLOCK).all()
        np.testing.assert_array_equal(got, array, err_msg=name)


def test_token_ids_positions_and_logits_of_padded_rows():
    """Each row's tokens from the left, zeros after; the logits' rows are each row's last
    `num_logits` tokens, flat into batch * seq (a prompt chunk wanting every position's, a row
    wanting none, a decode wanting one)."""
    rows = [
        Row([1, 2, 3], 0, [3], [3], 0, 3),
        Row([4, 5], 8, [5, 6, 7], [6, 7], 1, 0),
        Row([6], 2, [8], [8], 0, 1),
    ]
    b = build_batch(rows, BS)
    assert b.input_ids.tolist() == [[1, 2, 3], [4, 5, 0], [6, 0, 0]]
    assert b.positions.tolist() == [[0, 1, 2], [8, 9, 0], [2, 0, 0]]
    assert b.logits_indices.tolist() == [0, 1, 2, 6]
    assert b.context_lens.tolist() == [3, 10, 3]
    sink = io.SINK_BLOCK * BS
    assert b.slot_mapping.tolist() == [[3 * BS, 3 * BS + 1, 3 * BS + 2], [7 * BS, 7 * BS + 1, sink], [8 * BS + 2, sink, sink]]
    assert b.window_slot_mapping.tolist() == [
        [3 * BS, 3 * BS + 1, 3 * BS + 2],
        [7 * BS, 7 * BS + 1, sink],
        [8 * BS + 2, sink, sink],
    ]


def test_a_row_past_its_blocks_is_refused_with_the_first_such_row():
    """Row 1's window table starts at logical block 1 but holds one block; positions 8..9 are in
    logical block 2: the error names that row (row 2 lacks a block too, of its full table)."""
    rows = [Row([1], 0, [3], [3], 0, 1), Row([4, 5], 8, [5, 6, 7], [6], 1, 1), Row([6], 4, [8], [8], 1, 1)]
    with pytest.raises(ValueError) as err:
        build_batch(rows, BS)
    assert str(err.value) == "positions 8..9 need logical blocks 2..2; the row has blocks 1..1 of 4"


def _general(rows: list[Row]) -> list[Row]:
    """The same rows with a second (unread) logit each: build_batch's whole-array path, whose arrays for
    these rows differ from the decode path's only in logits_indices."""
    return [Row(r.token_ids, r.start, r.block_table, r.window_table, r.window_first, 2) for r in rows]


def test_decode_rows_take_the_arrays_of_the_whole_array_path():
    """A decode step (a token and a logit a row) is built from Python lists (_decode_batch): every array,
    its dtype and shape as the whole-array path gives them, on random rows with released window blocks."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = []
        for _ in range(int(rng.integers(1, 6))):
            start = int(rng.integers(0, 40))
            table = [int(b) for b in rng.integers(1, 99, start // BS + 1 + int(rng.integers(0, 3)))]
            first = int(rng.integers(0, start // BS + 1))
            window = [int(b) for b in rng.integers(1, 99, start // BS + 1 - first + int(rng.integers(0, 2)))]
            rows.append(Row([int(rng.integers(0, 1000))], start, table, window, first, 1))
        fast, whole = build_batch(rows, BS), build_batch(_general(rows), BS)
        for name, array in vars(whole).items():
            got = getattr(fast, name)
            if name == io.LOGITS_INDICES:
                array = np.arange(len(rows))  # the last of each row's (one) token
            assert got.dtype == array.dtype and got.shape == array.shape, name
            np.testing.assert_array_equal(got, array, err_msg=name)


def test_a_decode_row_past_its_blocks_is_refused_as_any_row():
    rows = [Row([1], 0, [3], [3], 0, 1), Row([4], 8, [5, 6, 7], [6], 1, 1)]
    with pytest.raises(ValueError) as err:
        build_batch(rows, BS)
    assert str(err.value) == "positions 8..8 need logical blocks 2..2; the row has blocks 1..1 of 4"
