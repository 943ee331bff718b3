"""The KV cache facade: block bookkeeping, the bytes behind it, and recovery, in one object.

HMT (hierarchical memory tiers) keeps KV blocks in device memory, host memory and NVMe;
A2CR (attention-aware cache replacement, wicore.blocks.policy) picks which cached blocks stay
near the device. This class puts the parts together:

    scheduler ──► allocate / append / swap_out / swap_in / free ...   (BlockGroups: integers,
                  returns Move plans)
    engine    ──► execute(moves) -> ids of sequences whose KV was lost
                  (one Pager per group copies bytes between its TierStores; a corrupt NVMe block
                  is dropped here, and its holders are named so the scheduler recomputes them)
    runner    ──► attention mass per block -> record_attention (A2CR's signal)

The tier-0 stores are handed in (the runtime builds them over the buffers its graphs bind),
so this package never touches an execution provider.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import BlockPool, Move
from wicore.blocks.tier import Tier
from wicore.kv.pager import Pager
from wicore.kv.tiers import NvmeStore, TierStore


class KVCache(BlockGroups):
    """BlockGroups whose moves are executed by one pager per group."""

    def __init__(self, pools: Sequence[BlockPool], pagers: Sequence[Pager], window: int | None = None) -> None:
        if len(pools) != len(pagers):
            raise ValueError(f"{len(pools)} block groups but {len(pagers)} pagers")
        super().__init__(pools[0], *((pools[1], window) if len(pools) > 1 else ()))
        self.pagers = list(pagers)

    def execute(self, moves: list[Move]) -> set[int]:
        """Copy the bytes of a plan's moves, each by its group's pager, in plan order.

        A block found corrupt (NVMe checksum) is dropped from the bookkeeping; the ids of the
        sequences that held one are returned: their KV is lost and must be recomputed."""
        if not moves:  # most steps (every decode step without swaps): nothing to copy, no pager asked
            return set()
        corrupt = {
            (group, b) for group, pager in enumerate(self.pagers) for b in pager.execute([m for m in moves if m.group == group])
        }
        if not corrupt:
            return set()
        lost = self.holders(corrupt)
        for group, block_id in corrupt:
            self.invalidate(group, block_id)
        return lost

    def record_attention(self, block_ids: Sequence[int], mass: Sequence[float]) -> None:
        """Attention mass each of the full group's `block_ids` received in one step."""
        now = time.monotonic()
        for block_id, value in zip(block_ids, mass):
            self.full.pool.add_attention(block_id, value, now)

    def store(self, group: int, tier: Tier) -> TierStore:
        """The store that holds one group's blocks in one tier (the staging of offloaded steps reads it)."""
        return self.pagers[group].stores[tier]

    @property
    def num_corrupt(self) -> int:
        return sum(p.stats.num_corrupt for p in self.pagers)

    def group_usage(self, group: int) -> dict[str, dict[str, int]]:
        """Blocks of one group per tier: in use (referenced or cached), referenced, free."""
        pool = self.groups[group].pool
        return {
            "blocks_in_use": {t.name.lower(): pool.usage(t) for t in Tier},
            "blocks_referenced": {t.name.lower(): pool.usage(t) - pool.num_evictable(t) for t in Tier},
            "blocks_free": {t.name.lower(): pool.num_free(t) for t in Tier},
        }

    def close(self) -> None:
        """Delete the NVMe tier's files (a cache, not data)."""
        for pager in self.pagers:
            store = pager.stores.pop(Tier.NVME, None)
            if isinstance(store, NvmeStore):
                store.close()
