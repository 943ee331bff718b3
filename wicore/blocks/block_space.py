"""Where every KV block lies: tiers, frames, free lists, refcounts, the prefix cache map, eviction.

The bookkeeping under BlockPool (which adds sequences and prefix hashing). No bytes
move here either: calls that need bytes moved append `Move`s to a plan.

Every frame of a tier is in one of these states (`usage` = owned + cached):

    DEVICE | sink | owned: ref_count > 0 | cached, ref_count 0 (evictable) | free |
             frame 0: padding rows of a step scatter here; never handed out
    HOST   | owned (swapped out)  | cached, ref_count 0 (evictable) | free |
    NVME   | owned (swapped out)  | cached, ref_count 0 (evictable) | free |

Invariants: a block is in exactly one (tier, frame) and a frame holds at most one
block; ref_count = number of sequences holding the block; a block with ref_count 0
is cached (otherwise it is retired at once: frame freed, id recyclable); a running
(not swapped) sequence has all its blocks on DEVICE, unless its pool offloads (BlockPool's
`offload`: then on DEVICE or HOST, and staged to the device each step).

Eviction is a cascade down the tiers: to free DEVICE frames, the policy's worst
unreferenced cached DEVICE blocks are demoted to HOST as far as HOST has room
(HOST first making room the same way, towards NVME), and the rest are dropped.
Candidates the policy scores equal go deepest block first, so a cached prefix loses
its tail before its head (a tail without its head can never be hit).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wicore.blocks.column import Column
from wicore.blocks.policy import EvictionPolicy
from wicore.blocks.tier import Tier


@dataclass(frozen=True)
class Move:
    """Copy one block's bytes from `src` to `dst` ((tier, frame) each); dst None = dropped, no copy."""

    block_id: int
    src: tuple[Tier, int]
    dst: tuple[Tier, int] | None
    group: int = 0  # the block group (wicore.kv.cache) whose stores hold the block


@dataclass(frozen=True)
class BlockInfo:
    """A snapshot of one live block (for metrics, debugging and tests)."""

    block_id: int
    tier: Tier
    frame: int
    ref_count: int
    is_cached: bool


@dataclass
class Block:
    block_id: int
    tier: Tier
    frame: int
    ref_count: int = 0
    hash: bytes | None = None  # set only while the prefix cache maps this hash to this block


class BlockSpace:
    """The blocks of one block group over its three tiers, and how they move between them."""

    SINK_SLOT = 0  # DEVICE frame for padding rows' writes; never handed out

    def __init__(
        self,
        num_device_blocks: int,
        num_host_blocks: int,
        num_nvme_blocks: int,
        policy: EvictionPolicy,
        clock: Callable[[], float] = time.monotonic,
        group: int = 0,
    ) -> None:
        if num_device_blocks < 2:
            raise ValueError(f"num_device_blocks must be >= 2 (frame 0 is the padding sink), got {num_device_blocks}")
        if num_host_blocks < 0 or num_nvme_blocks < 0:
            raise ValueError(f"host and NVMe block counts must be >= 0, got {num_host_blocks} and {num_nvme_blocks}")
        self.group = group
        self.policy = policy
        self._clock = clock
        # Sorted lists are heaps: the lowest free frame is handed out first.
        self._free_frames = {
            Tier.DEVICE: list(range(self.SINK_SLOT + 1, num_device_blocks)),
            Tier.HOST: list(range(num_host_blocks)),
            Tier.NVME: list(range(num_nvme_blocks)),
        }
        self._num_frames = {t: len(frames) for t, frames in self._free_frames.items()}
        self._evictable: dict[Tier, set[int]] = {t: set() for t in Tier}
        self._blocks: dict[int, Block] = {}
        self._cache: dict[bytes, int] = {}  # chain hash -> block id
        self._free_ids: list[int] = []  # heap of retired block ids, recycled lowest first
        self._next_id = 0
        self.layout_version = 0  # bumped whenever a referenced block changes frame (cached block tables go stale)
        self._depth = Column(0, np.int64)  # each live block's depth, to order eviction candidates at once

    def num_frames(self, tier: Tier) -> int:
        """Usable frames of the tier (DEVICE: all but the sink)."""
        return self._num_frames[tier]

    def num_free(self, tier: Tier) -> int:
        """Slots neither owned by a sequence nor holding a cached block."""
        return len(self._free_frames[tier])

    def num_evictable(self, tier: Tier) -> int:
        """Cached blocks with ref_count 0 in the tier."""
        return len(self._evictable[tier])

    def usage(self, tier: Tier) -> int:
        """Slots in use in the tier (owned or cached)."""
        return self._num_frames[tier] - self.num_free(tier)

    def blocks(self) -> list[BlockInfo]:
        """Every live block (owned or cached), by id."""
        return [
            BlockInfo(b.block_id, b.tier, b.frame, b.ref_count, b.hash is not None)
            for b in sorted(self._blocks.values(), key=lambda b: b.block_id)
        ]

    def _room(self, tier: Tier) -> int:
        """Slots the tier can give: free ones plus those of its evictable cached blocks."""
        return self.num_free(tier) + self.num_evictable(tier)

    def _lower(self, tier: Tier) -> Tier | None:
        """The next tier down that exists (has frames), where the tier's victims are demoted."""
        return next((t for t in Tier if t > tier and self._num_frames[t] > 0), None)

    def _fits(self, hit_ids: list[int], num_new: int) -> bool:
        """Whether DEVICE can take `num_new` fresh blocks plus the reused `hit_ids` held elsewhere."""
        num_away = sum(self._blocks[b].tier is not Tier.DEVICE for b in hit_ids)
        num_pinned = len(self._evictable[Tier.DEVICE].intersection(hit_ids))  # reused, so no longer evictable
        return num_new + num_away <= self._room(Tier.DEVICE) - num_pinned

    def _unref(self, block_ids: list[int], now: float) -> None:
        """Each block loses one reference; unreferenced cached blocks become evictable, the rest retire."""
        for block_id in block_ids:
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0 and block.hash is None:
                self._retire(block)
                continue
            self.policy.touch(block_id, now)
            if block.ref_count == 0:
                self._evictable[block.tier].add(block_id)

    def _make_room(self, tier: Tier, num_frames: int, now: float) -> list[Move]:
        """Evict cached blocks until `tier` has `num_frames` free frames (the caller checked that
        free + evictable suffice); return the moves, in execution order.

        The policy picks the victims; the best of them are demoted one tier down as far as
        that tier has room (it first makes room the same way), the worst are dropped.
        """
        moves: list[Move] = []
        shortfall = num_frames - self.num_free(tier)
        if shortfall <= 0:
            return moves
        ids = np.fromiter(self._evictable[tier], np.int64, len(self._evictable[tier]))
        candidates = ids[np.lexsort((ids, -self._depth.take(ids)))]  # deepest first, then by id
        victims = self.policy.order(candidates, now)[:shortfall]
        assert len(victims) == shortfall, f"{tier.name}: {shortfall} frames wanted, the caller checked the room"
        lower = self._lower(tier)
        num_demoted = 0 if lower is None else min(shortfall, self._room(lower))
        if lower is not None:
            moves += self._make_room(lower, num_demoted, now)
        num_dropped = shortfall - num_demoted
        for block_id in victims[:num_dropped]:
            self._drop(block_id, moves)
        if lower is not None:
            for block_id in victims[num_dropped:]:
                self._relocate(block_id, lower, moves)
        return moves

    def _to_device(self, block_ids: list[int], num_new: int, now: float) -> list[Move]:
        """Make DEVICE room for `block_ids` (held elsewhere) and `num_new` fresh blocks, then move
        the blocks up; the fresh blocks are the caller's to create.

        While DEVICE has free frames a block moves straight up. Once it must evict, each block
        first moves to the sink frame (scratch space between steps), so that the frame it leaves
        below can take the DEVICE victim demoted to make room for it (a swap, which a plan
        executed in order cannot do directly), and then into the freed DEVICE frame.
        """
        moves: list[Move] = []
        for block_id in block_ids:
            if self.num_free(Tier.DEVICE):
                self._relocate(block_id, Tier.DEVICE, moves)
                continue
            block = self._blocks[block_id]
            moves.append(Move(block_id, (block.tier, block.frame), (Tier.DEVICE, self.SINK_SLOT), self.group))
            heapq.heappush(self._free_frames[block.tier], block.frame)
            block.tier, block.frame = Tier.DEVICE, self.SINK_SLOT
            self.layout_version += 1
            moves += self._make_room(Tier.DEVICE, 1, now)
            frame = heapq.heappop(self._free_frames[Tier.DEVICE])
            moves.append(Move(block_id, (Tier.DEVICE, self.SINK_SLOT), (Tier.DEVICE, frame), self.group))
            block.frame = frame
        return moves + self._make_room(Tier.DEVICE, num_new, now)

    def _relocate(self, block_id: int, dst: Tier, moves: list[Move]) -> None:
        """Move the block to the lowest free frame of `dst` (the caller made room)."""
        block = self._blocks[block_id]
        frame = heapq.heappop(self._free_frames[dst])
        moves.append(Move(block_id, (block.tier, block.frame), (dst, frame), self.group))
        heapq.heappush(self._free_frames[block.tier], block.frame)
        if block_id in self._evictable[block.tier]:
            self._evictable[block.tier].remove(block_id)
            self._evictable[dst].add(block_id)
        block.tier, block.frame = dst, frame
        if block.ref_count:
            self.layout_version += 1

    def _drop(self, block_id: int, moves: list[Move]) -> None:
        """Discard an unreferenced cached block: out of the cache, frame and id freed."""
        block = self._blocks[block_id]
        moves.append(Move(block_id, (block.tier, block.frame), None, self.group))
        self._uncache(block)
        self._retire(block)

    def _uncache(self, block: Block) -> None:
        if block.hash is not None:
            del self._cache[block.hash]
            block.hash = None

    def _retire(self, block: Block) -> None:
        """Free the block's frame and id; the block must be unreferenced and out of the cache."""
        self._evictable[block.tier].discard(block.block_id)
        heapq.heappush(self._free_frames[block.tier], block.frame)
        heapq.heappush(self._free_ids, block.block_id)
        del self._blocks[block.block_id]
        self.policy.forget(block.block_id)

    def _acquire(self, block_id: int, now: float) -> None:
        """A prefix hit: one more reference, so the block is no longer evictable."""
        block = self._blocks[block_id]
        block.ref_count += 1
        self._evictable[block.tier].discard(block_id)
        self.policy.touch(block_id, now)

    def _new_block(self, now: float, depth: int, tier: Tier = Tier.DEVICE) -> int:
        """A fresh block in `tier` with one reference for logical block `depth` (the caller made room)."""
        if self._free_ids:
            block_id = heapq.heappop(self._free_ids)
        else:
            block_id, self._next_id = self._next_id, self._next_id + 1
        frame = heapq.heappop(self._free_frames[tier])
        self._blocks[block_id] = Block(block_id, tier, frame, ref_count=1)
        self._depth.set(block_id, depth)
        self.policy.touch(block_id, now)
        return block_id

    def _offload_blocks(self, first: int, num_new: int, now: float, moves: list[Move]) -> list[int]:
        """`num_new` fresh blocks for logical blocks first.. of an offloaded sequence: the last ones
        (the tail, written next) on DEVICE as far as it has room, the first ones on HOST. HOST's
        room is made first, so DEVICE's victims then demote into what HOST has left."""
        num_host = max(0, num_new - self._room(Tier.DEVICE))
        moves += self._make_room(Tier.HOST, num_host, now)
        host_ids = [self._new_block(now, first + i, Tier.HOST) for i in range(num_host)]
        moves += self._make_room(Tier.DEVICE, num_new - num_host, now)
        return host_ids + [self._new_block(now, first + i, Tier.DEVICE) for i in range(num_host, num_new)]

    def _lift(self, block_ids: list[int], now: float) -> list[Move]:
        """Bring NVME blocks a running offloaded sequence holds up to HOST, or to DEVICE when HOST is full."""
        moves: list[Move] = []
        for block_id in block_ids:
            if self._room(Tier.HOST):
                moves += self._make_room(Tier.HOST, 1, now)
                self._relocate(block_id, Tier.HOST, moves)
            else:
                moves += self._to_device([block_id], 0, now)
        return moves
