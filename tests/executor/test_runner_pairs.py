"""wicore.executor.runner._pairs: the fed rows' (row, slot) pairs as two int64 arrays."""

from __future__ import annotations

import numpy as np

from wicore.executor.runner import _pairs


def test_pairs_split_into_their_firsts_and_seconds():
    rows, slots = _pairs([(3, 0), (1, 2), (7, 1)])
    assert rows.dtype == slots.dtype == np.int64
    assert rows.tolist() == [3, 1, 7] and slots.tolist() == [0, 2, 1]


def test_no_pairs_are_two_empty_int64_arrays_that_index_nothing():
    rows, slots = _pairs([])
    assert rows.shape == slots.shape == (0,) and rows.dtype == slots.dtype == np.int64
    tokens = np.arange(4)
    tokens[slots] = np.array([9, 9, 9])[rows]  # as run_device uses them: no element moves
    assert tokens.tolist() == [0, 1, 2, 3]
