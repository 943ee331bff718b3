"""Executes the block pool's move plans against the tier stores."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wicore.blocks.block_pool import Move
from wicore.blocks.tier import Tier
from wicore.kv.tiers import BatchedTierStore, CorruptBlockError, TierStore


@dataclass
class PagerStats:
    num_moves: dict[tuple[str, str], int] = field(default_factory=dict)  # (src tier, dst tier) -> count
    num_corrupt: int = 0


class Pager:
    def __init__(self, stores: dict[Tier, TierStore]) -> None:
        self.stores = stores
        self.stats = PagerStats()

    def execute(self, moves: list[Move]) -> set[int]:
        """Copy each moved block's bytes, as in plan order; return the ids of blocks found corrupt.

        Consecutive moves between the same two tiers run as one batch (all reads, then all
        writes; one graph run on a BatchedTierStore) only where that equals plan order: a
        batch never reads a frame it writes nor writes a frame twice, so a plan may still hand
        out a frame that an earlier move vacated. A corrupt block's destination is left as it
        was: its holders must recompute.
        """
        corrupt: set[int] = set()
        for batch in _batches(moves):
            src_tier, dst = batch[0].src[0], batch[0].dst
            key = (Tier(src_tier).name.lower(), "dropped" if dst is None else Tier(dst[0]).name.lower())
            self.stats.num_moves[key] = self.stats.num_moves.get(key, 0) + len(batch)
            if dst is None:
                continue
            src_store, dst_store = self.stores[src_tier], self.stores[dst[0]]
            if isinstance(src_store, BatchedTierStore):
                good, blocks = batch, list(src_store.read_many([m.src[1] for m in batch]))
            else:
                good, blocks = [], []
                for move in batch:
                    try:
                        blocks.append(src_store.read(move.src[1]))
                        good.append(move)
                    except CorruptBlockError:
                        corrupt.add(move.block_id)
                        self.stats.num_corrupt += 1
            if isinstance(dst_store, BatchedTierStore):
                if good:
                    dst_store.write_many([dst_frame(m) for m in good], np.stack(blocks))
            else:
                for move, data in zip(good, blocks):
                    dst_store.write(dst_frame(move), data)
        return corrupt


def dst_frame(move: Move) -> int:
    """The frame a copying move writes (drops have no destination and are never copied)."""
    assert move.dst is not None, "a drop copies nothing"
    return move.dst[1]


def _batches(moves: list[Move]) -> list[list[Move]]:
    """The plan cut into runs of consecutive moves between the same tiers, each cut before a
    move that reads a frame the run writes or writes one it already writes."""
    batches: list[list[Move]] = []
    written: set[tuple[Tier, int]] = set()
    last_pair = None
    for move in moves:
        pair = (move.src[0], None if move.dst is None else move.dst[0])
        if pair != last_pair or move.src in written or move.dst in written:
            batches.append([])
            written = set()
        batches[-1].append(move)
        last_pair = pair
        if move.dst is not None:
            written.add(move.dst)
    return batches
