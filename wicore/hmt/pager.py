"""Executes the block pool's move plans against the tier stores."""

from __future__ import annotations

from dataclasses import dataclass, field

from wicore.hmt.block_pool import Move
from wicore.hmt.policy import Tier
from wicore.hmt.tiers import CorruptBlockError, TierStore


@dataclass
class PagerStats:
    num_moves: dict[tuple[str, str], int] = field(default_factory=dict)  # (src tier, dst tier) -> count
    num_corrupt: int = 0


class Pager:
    def __init__(self, stores: dict[Tier, TierStore]) -> None:
        self.stores = stores
        self.stats = PagerStats()

    def execute(self, moves: list[Move]) -> set[int]:
        """Copy each moved block's bytes, in plan order; return the ids of blocks found corrupt.

        A corrupt block's destination is left as it was: its holders must recompute.
        """
        corrupt: set[int] = set()
        for move in moves:
            src_tier, src_slot = move.src
            dst_name = "dropped" if move.dst is None else Tier(move.dst[0]).name.lower()
            key = (Tier(src_tier).name.lower(), dst_name)
            self.stats.num_moves[key] = self.stats.num_moves.get(key, 0) + 1
            if move.dst is None:
                continue
            try:
                data = self.stores[src_tier].read(src_slot)
            except CorruptBlockError:
                corrupt.add(move.block_id)
                self.stats.num_corrupt += 1
                continue
            dst_tier, dst_slot = move.dst
            self.stores[dst_tier].write(dst_slot, data)
        return corrupt
