"""A batch row for tests that build graph inputs by hand (`wicore.executor.batch.build_batch`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """A wicore.executor.batch.BatchRow. By default the sliding layers get the full layers' blocks,
    none released, and logits come for the last token only."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    window_table: list[int] | None = None
    window_first: int = 0
    num_logits: int = 1

    def __post_init__(self) -> None:
        if self.window_table is None:
            object.__setattr__(self, "window_table", self.block_table)
