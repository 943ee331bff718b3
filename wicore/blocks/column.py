"""A value per block id, kept in a numpy array so that a whole candidate set is read at once.

Block ids are small and dense (retired ids are recycled lowest first), so an array indexed by
id is the per-block table; it grows by doubling when an id past its end is written or read.
"""

from __future__ import annotations

import numpy as np


class Column:
    """`fill` for every block id until one is set."""

    def __init__(self, fill: float, dtype: type = np.float64) -> None:
        self.fill = fill
        self._values: np.ndarray = np.full(64, fill, dtype=dtype)

    def get(self, block_id: int) -> float:
        return self._values[block_id].item() if block_id < len(self._values) else self.fill

    def set(self, block_id: int, value: float) -> None:
        if block_id >= len(self._values):
            self._grow(block_id + 1)
        self._values[block_id] = value

    def take(self, block_ids: np.ndarray) -> np.ndarray:
        """The values of `block_ids` (int64), in their order (a copy)."""
        if len(block_ids) and int(block_ids.max()) >= len(self._values):
            self._grow(int(block_ids.max()) + 1)
        return self._values[block_ids]

    def _grow(self, size: int) -> None:
        grown = np.full(max(size, 2 * len(self._values)), self.fill, dtype=self._values.dtype)
        grown[: len(self._values)] = self._values
        self._values = grown
