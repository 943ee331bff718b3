"""Graph inputs of one batch of rows: token ids, positions and the paging arrays.

A row runs some tokens of one sequence against its block tables (wicore.graph.io says what
each array holds). Block size 4, a row of 3 tokens from position 5, blocks [7, 2]:

    positions     5  6  7              slot_mapping  2*4+1  2*4+2  2*4+3   (block 2, offsets 1..3)
    block_table   [7, 2]               context_len   8
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from wicore.graph import io


@dataclass(frozen=True)
class BatchInputs:
    """One graph run: `batch` rows of `seq` tokens each; the fields are named as the graph inputs
    (wicore.graph.io says what each array holds)."""

    input_ids: np.ndarray  # [batch, seq] int64
    positions: np.ndarray  # [batch, seq] int64
    slot_mapping: np.ndarray  # [batch, seq] int64
    block_tables: np.ndarray  # [batch, max_blocks] int64
    context_lens: np.ndarray  # [batch] int64
    logits_indices: np.ndarray  # [num_logits] int64, flat into batch * seq
    window_slot_mapping: np.ndarray  # [batch, seq] int64, the sliding layers' block group
    window_block_tables: np.ndarray  # [batch, max_window_blocks] int64
    window_first_block: np.ndarray  # [batch] int64
    # the paged attention's (graph/paged_attention.py)
    cumulative_seqlens: np.ndarray  # [batch + 1] int32
    past_seqlens: np.ndarray  # [batch] int32
    attention_bounds: np.ndarray  # [2] int32
    window_past_seqlens: np.ndarray  # [batch] int32, from the row's first window block
    window_attention_bounds: np.ndarray  # [2] int32
    window_logical_tables: np.ndarray  # [batch, max_blocks] int64, window blocks at their logical index

    def rows(self, lo: int, hi: int) -> BatchInputs:
        """Rows lo .. hi - 1 as a batch of their own (a micro-batch, wicore.executor.pipeline): the
        same paging arrays and table widths, the logits' rows renumbered from the first row's."""
        seq = self.input_ids.shape[1]
        keep = (self.logits_indices >= lo * seq) & (self.logits_indices < hi * seq)
        past, window_past = self.past_seqlens[lo:hi], self.window_past_seqlens[lo:hi]
        return BatchInputs(
            self.input_ids[lo:hi],
            self.positions[lo:hi],
            self.slot_mapping[lo:hi],
            self.block_tables[lo:hi],
            self.context_lens[lo:hi],
            self.logits_indices[keep] - lo * seq,
            self.window_slot_mapping[lo:hi],
            self.window_block_tables[lo:hi],
            self.window_first_block[lo:hi],
            np.arange(hi - lo + 1, dtype=np.int32) * seq,
            past,
            np.asarray([seq, past.max() + seq], np.int32),
            window_past,
            np.asarray([seq, window_past.max() + seq], np.int32),
            self.window_logical_tables[lo:hi],
        )

    def next_decode(self, rows: Sequence[BatchRow], block_size: int, changed: Sequence[int] = ()) -> BatchInputs | None:
        """The decode batch (a token a row) of `rows`, this batch's rows each one position further: what
        `build_batch(rows)` gives, from this batch's arrays in ~10 NumPy calls (issue 37). A row whose
        position is in the block of its last keeps its tables; `changed`: the indices of rows whose
        tables changed (a new block, a window block released), written from the row. None where a
        table's width would change, or a position lies outside its tables: build the batch anew."""
        slots, window_slots = self.slot_mapping + 1, self.window_slot_mapping + 1
        window_past = self.window_past_seqlens + 1
        tables, windows, first = self.block_tables, self.window_block_tables, self.window_first_block
        logical = self.window_logical_tables
        if changed:
            if _decode_widths(rows, block_size) != (tables.shape[1], windows.shape[1], logical.shape[1]):
                return None
            tables, windows, first, logical = tables.copy(), windows.copy(), first.copy(), logical.copy()
            for i in changed:
                row = rows[i]
                full, window, f, start = row.block_table, row.window_table, row.window_first, row.start
                tables[i] = io.SINK_BLOCK
                tables[i, : len(full)] = full
                windows[i] = io.SINK_BLOCK
                windows[i, : len(window)] = window
                logical[i] = io.SINK_BLOCK
                logical[i, f : f + len(window)] = window
                b, offset = divmod(start, block_size)
                slots[i, 0] = full[b] * block_size + offset
                window_slots[i, 0] = window[b - f] * block_size + offset
                first[i] = f
                window_past[i] = start - f * block_size
        return BatchInputs(
            np.array([r.token_ids[0] for r in rows], np.int64)[:, None],
            self.positions + 1,
            slots,
            tables,
            self.context_lens + 1,
            self.logits_indices,
            window_slots,
            windows,
            first,
            self.cumulative_seqlens,
            self.past_seqlens + 1,
            self.attention_bounds + _NEXT_BOUND,
            window_past,
            np.array([1, window_past.max() + 1], np.int32) if changed else self.window_attention_bounds + _NEXT_BOUND,
            logical,
        )

    def paging_inputs(self) -> dict[str, np.ndarray]:
        """Every array but the token ids and the logits' rows, by graph input name: each field is
        named as the input it feeds."""
        return {name: array for name, array in vars(self).items() if name not in (io.INPUT_IDS, io.LOGITS_INDICES)}


_NEXT_BOUND = np.array([0, 1], np.int32)  # attention bounds [tokens a row, the longest context] one token on
BATCH_FIELDS = tuple(f.name for f in fields(BatchInputs))  # every array of a batch, by its graph input's name


class BatchRow(Protocol):
    """One row: run `token_ids` (positions start, start + 1, ...) of a sequence whose blocks, in
    order, are the DEVICE frames `block_table`. Its sliding layers' blocks are `window_table`,
    the first of them holding logical block `window_first` (the blocks before it fell out of
    the window and were released). Logits are wanted for its last `num_logits` tokens."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def start(self) -> int: ...
    @property
    def block_table(self) -> Sequence[int]: ...
    @property
    def window_table(self) -> Sequence[int]: ...
    @property
    def window_first(self) -> int: ...
    @property
    def num_logits(self) -> int: ...


def build_batch(rows: Sequence[BatchRow], block_size: int) -> BatchInputs:
    """Graph inputs for `rows`. Rows shorter than the longest are padded: their extra slots
    write to the sink block at position 0 and are never read. The logits come out row by
    row, each row's last `num_logits` tokens in order.

    Built with whole-array operations over the batch: the Python work per row is reading its
    fields, so a step of hundreds of decode rows costs little more on the host than their arrays.
    A decode step (a token and a logit a row) takes `_decode_batch`, the same arrays."""
    if rows and all(len(r.token_ids) == 1 and r.num_logits == 1 for r in rows):
        decoded = _decode_batch(rows, block_size)
        if decoded is not None:
            return decoded
    batch = len(rows)
    lengths = _ints(len(r.token_ids) for r in rows)
    starts = _ints(r.start for r in rows)
    first = _ints(r.window_first for r in rows)
    num_logits = _ints(r.num_logits for r in rows)
    seq_len = int(lengths.max())
    filled = np.arange(seq_len) < lengths[:, None]  # [batch, seq]: a row's own tokens, not its padding
    input_ids = np.zeros((batch, seq_len), np.int64)
    input_ids[filled] = _ints(t for r in rows for t in r.token_ids)
    positions = np.where(filled, starts[:, None] + np.arange(seq_len), 0)
    # A padded row's padding reaches block (start + seq_len - 1) // block_size: the paged attention
    # reads that far (for the padding's own queries), so the tables list the sink block up to there.
    reach = -(-(starts + seq_len) // block_size)
    full_tables = [r.block_table for r in rows]
    window_tables = [r.window_table for r in rows]
    num_full, num_window = _ints(map(len, full_tables)), _ints(map(len, window_tables))
    tables = _table(full_tables, num_full, max(int(reach.max()), int(num_full.max())))
    windows = _table(window_tables, num_window, max(int((reach - first).max()), int(num_window.max())))
    no_first = np.zeros(batch, np.int64)
    _check_reach(positions, filled, ((no_first, num_full), (first, num_window)), block_size)
    slots = _slots(tables, positions, filled, no_first, block_size)
    window_slots = _slots(windows, positions, filled, first, block_size)
    logical_width = max(tables.shape[1], int((first + num_window).max()))
    columns = np.arange(logical_width)
    logical_tables = np.full((batch, logical_width), io.SINK_BLOCK, np.int64)
    logical_tables[(columns >= first[:, None]) & (columns < (first + num_window)[:, None])] = windows[
        np.arange(windows.shape[1]) < num_window[:, None]
    ]
    # each row's last num_logits tokens, flat into batch * seq
    row_ends = np.arange(batch, dtype=np.int64) * seq_len + lengths
    offsets = np.arange(int(num_logits.sum()), dtype=np.int64) - np.repeat(np.cumsum(num_logits) - num_logits, num_logits)
    logits_indices = np.repeat(row_ends - num_logits, num_logits) + offsets
    window_past = starts - first * block_size
    return BatchInputs(
        input_ids,
        positions,
        slots,
        tables,
        lengths + starts,
        logits_indices,
        window_slots,
        windows,
        first,
        np.arange(batch + 1, dtype=np.int32) * seq_len,
        starts.astype(np.int32),
        np.asarray([seq_len, starts.max() + seq_len], np.int32),
        window_past.astype(np.int32),
        np.asarray([seq_len, window_past.max() + seq_len], np.int32),
        logical_tables,
    )


def _decode_batch(rows: Sequence[BatchRow], block_size: int) -> BatchInputs | None:
    """build_batch's arrays for rows of one token and one logit each, from Python lists: ~10 NumPy calls
    instead of ~60, which took ~0.2 ms of a tiny model's ~2 ms decode step at one row (docs/PERFORMANCE.md,
    issue 37). The tables are copied row by row into arrays made once: padded lists of lists through
    np.array took ~2x as long at 64 rows of 4K tokens. None where a row's position lies outside one of its
    tables: build_batch raises its error."""
    sink = io.SINK_BLOCK
    starts = [r.start for r in rows]
    firsts = [r.window_first for r in rows]
    full_tables = [r.block_table for r in rows]
    window_tables = [r.window_table for r in rows]
    widths = _decode_widths(rows, block_size)
    if widths is None:
        return None
    width, window_width, logical_width = widths
    blocks = [s // block_size for s in starts]
    offsets = [s % block_size for s in starts]
    slots = [[t[b] * block_size + o] for t, b, o in zip(full_tables, blocks, offsets)]
    window_slots = [[w[b - f] * block_size + o] for w, b, f, o in zip(window_tables, blocks, firsts, offsets)]
    window_past = [s - f * block_size for s, f in zip(starts, firsts)]
    batch = len(rows)
    tables = np.full((batch, width), sink, np.int64)
    windows = np.full((batch, window_width), sink, np.int64)
    logical = np.full((batch, logical_width), sink, np.int64)
    for i, (full, window, first) in enumerate(zip(full_tables, window_tables, firsts)):
        tables[i, : len(full)] = full
        windows[i, : len(window)] = window
        logical[i, first : first + len(window)] = window
    starts_array = np.array(starts, np.int64)
    return BatchInputs(
        np.array([[r.token_ids[0]] for r in rows], np.int64),
        starts_array[:, None],
        np.array(slots, np.int64),
        tables,
        starts_array + 1,
        np.arange(batch, dtype=np.int64),
        np.array(window_slots, np.int64),
        windows,
        np.array(firsts, np.int64),
        np.arange(batch + 1, dtype=np.int32),
        starts_array.astype(np.int32),
        np.array([1, max(starts) + 1], np.int32),
        np.array(window_past, np.int32),
        np.array([1, max(window_past) + 1], np.int32),
        logical,
    )


def _decode_widths(rows: Sequence[BatchRow], block_size: int) -> tuple[int, int, int] | None:
    """The full, window and logical tables' widths of a decode batch of `rows` (None where a row's
    position lies outside one of its tables: build_batch raises its error). A row's single token
    reaches logical block start // block_size, which its tables hold, so they are as wide as they are."""
    width = window_width = logical_width = 1
    for r in rows:
        b, full, window, f = r.start // block_size, r.block_table, r.window_table, r.window_first
        if not (b < len(full) and 0 <= b - f < len(window)):
            return None
        width = max(width, len(full))  # b < len(full): the table is as wide as the position needs
        window_width = max(window_width, len(window))
        logical_width = max(logical_width, f + len(window))
    return width, window_width, max(width, logical_width)


def _ints(values: Iterable[int]) -> np.ndarray:
    return np.fromiter(values, np.int64)


def _table(tables: Sequence[Sequence[int]], lengths: np.ndarray, width: int) -> np.ndarray:
    """[rows, width] block tables: each row's blocks from the left, then the sink block."""
    out = np.full((len(tables), max(width, 1)), io.SINK_BLOCK, np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = _ints(b for table in tables for b in table)
    return out


def _check_reach(
    positions: np.ndarray, filled: np.ndarray, groups: tuple[tuple[np.ndarray, np.ndarray], ...], block_size: int
) -> None:
    """ValueError for the first row whose positions need a block one of its tables does not hold
    (`groups`: each table's first logical block and length, per row; the first table checked first)."""
    outside = [
        filled & ((index < 0) | (index >= num[:, None]))
        for index, num in ((positions // block_size - first[:, None], num) for first, num in groups)
    ]
    bad = np.any([o.any(axis=1) for o in outside], axis=0)
    if not bad.any():
        return
    r = int(np.argmax(bad))
    first, num_blocks = next(g for g, o in zip(groups, outside) if o[r].any())
    pos = positions[r, filled[r]]
    raise ValueError(
        f"positions {pos[0]}..{pos[-1]} need logical blocks {pos[0] // block_size}..{pos[-1] // block_size}; "
        f"the row has blocks {first[r]}..{first[r] + num_blocks[r] - 1} of {block_size}"
    )


def _slots(tables: np.ndarray, positions: np.ndarray, filled: np.ndarray, first: np.ndarray, block_size: int) -> np.ndarray:
    """Each token's slot in the KV pool (its block's frame * block_size + its offset), the sink's
    first slot for padding; the tables hold every filled position's block (_check_reach)."""
    index = np.where(filled, positions // block_size - first[:, None], 0)
    frames = np.take_along_axis(tables, index, axis=1)
    return np.where(filled, frames * block_size + positions % block_size, io.SINK_BLOCK * block_size)
