"""Graph inputs of one batch of rows: token ids, positions and the paging arrays.

A row runs some tokens of one sequence against its block tables (wicore.graph.io says what
each array holds). Block size 4, a row of 3 tokens from position 5, blocks [7, 2]:

    positions     5  6  7              slot_mapping  2*4+1  2*4+2  2*4+3   (block 2, offsets 1..3)
    block_table   [7, 2]               context_len   8
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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

    def paging_inputs(self) -> dict[str, np.ndarray]:
        """Every array but the token ids and the logits' rows, by graph input name: each field is
        named as the input it feeds."""
        return {name: array for name, array in vars(self).items() if name not in (io.INPUT_IDS, io.LOGITS_INDICES)}


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
    row, each row's last `num_logits` tokens in order."""
    seq_len = max(len(r.token_ids) for r in rows)
    batch = len(rows)
    input_ids = np.zeros((batch, seq_len), np.int64)
    positions = np.zeros((batch, seq_len), np.int64)
    lens = np.zeros(batch, np.int64)
    first = np.zeros(batch, np.int64)
    # A padded row's padding reaches block (start + seq_len - 1) // block_size: the paged attention
    # reads that far (for the padding's own queries), so the tables list the sink block up to there.
    reach = [-(-(r.start + seq_len) // block_size) for r in rows]
    slots, tables = _paging_arrays(batch, seq_len, max(*reach, *(len(r.block_table) for r in rows)), block_size)
    window_width = max(*(n - r.window_first for n, r in zip(reach, rows)), *(len(r.window_table) for r in rows))
    window_slots, window_tables = _paging_arrays(batch, seq_len, window_width, block_size)
    logical_width = max(tables.shape[1], *(r.window_first + len(r.window_table) for r in rows))
    logical_tables = np.full((batch, logical_width), io.SINK_BLOCK, np.int64)
    logits_indices: list[int] = []
    for r, row in enumerate(rows):
        n = len(row.token_ids)
        end = row.start + n
        pos = np.arange(row.start, end)
        input_ids[r, :n] = row.token_ids
        positions[r, :n] = pos
        _place(row.block_table, 0, pos, slots[r], tables[r], block_size)
        _place(row.window_table, row.window_first, pos, window_slots[r], window_tables[r], block_size)
        lens[r] = end
        first[r] = row.window_first
        logical_tables[r, row.window_first : row.window_first + len(row.window_table)] = row.window_table
        logits_indices.extend(range(r * seq_len + n - row.num_logits, r * seq_len + n))
    past = np.asarray([r.start for r in rows], np.int64)
    window_past = past - first * block_size
    return BatchInputs(
        input_ids,
        positions,
        slots,
        tables,
        lens,
        np.asarray(logits_indices, np.int64),
        window_slots,
        window_tables,
        first,
        np.arange(batch + 1, dtype=np.int32) * seq_len,
        past.astype(np.int32),
        np.asarray([seq_len, past.max() + seq_len], np.int32),
        window_past.astype(np.int32),
        np.asarray([seq_len, window_past.max() + seq_len], np.int32),
        logical_tables,
    )


def _paging_arrays(batch: int, seq_len: int, max_blocks: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Slot mapping and block tables filled with the sink block (where padding goes)."""
    slots = np.full((batch, seq_len), io.SINK_BLOCK * block_size, np.int64)
    tables = np.full((batch, max(max_blocks, 1)), io.SINK_BLOCK, np.int64)
    return slots, tables


def _place(table: Sequence[int], first: int, pos: np.ndarray, slots: np.ndarray, tables: np.ndarray, block_size: int) -> None:
    """Fill one row's slots (for positions `pos`) and table from its blocks, the first of
    which holds logical block `first`."""
    blocks = np.asarray(table, np.int64)
    index = pos // block_size - first
    if len(pos) and (index[0] < 0 or index[-1] >= len(blocks)):
        raise ValueError(
            f"positions {pos[0]}..{pos[-1]} need logical blocks {pos[0] // block_size}..{pos[-1] // block_size}; "
            f"the row has blocks {first}..{first + len(blocks) - 1} of {block_size}"
        )
    slots[: len(pos)] = blocks[index] * block_size + pos % block_size
    tables[: len(blocks)] = blocks
