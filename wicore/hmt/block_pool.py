"""Integer bookkeeping for the paged KV cache over three tiers: ids, slots, refcounts, prefix hashes.

No bytes move here. A call that needs bytes moved returns a plan, a list of
`Move`s, which the pager executes in list order before the step runs: a plan may
hand out a slot that an earlier move of the same plan vacated.

A *block* holds the K/V of `block_size` consecutive tokens of a sequence and keeps
its `block_id` for as long as it lives; it lies in one tier at a *slot* (an index
into that tier's store). A sequence of 10 tokens, block_size 4, 8 computed:

    tokens      | t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 .  .  |
    block_ids   |      7      |      2      |      5      |  block_table: their DEVICE slots
    chain hash  |     h0      |     h1      |   (none)    |  h0 = H(b"", t0..t3), h1 = H(h0, t4..t7)
                |<-- num_computed = 8 ----->|

Only full, computed blocks enter the prefix cache (chain hash -> block); a prompt
whose leading blocks hash the same reuses them (ref_count + 1).

Every slot of a tier is in one of these states (`usage` = owned + cached):

    DEVICE | sink | owned: ref_count > 0 | cached, ref_count 0 (evictable) | free |
             slot 0: padding rows of a step scatter here; never handed out
    HOST   | owned (swapped out)  | cached, ref_count 0 (evictable) | free |
    NVME   | owned (swapped out)  | cached, ref_count 0 (evictable) | free |

Invariants: a block is in exactly one (tier, slot) and a slot holds at most one
block; ref_count = number of sequences holding the block; a block with ref_count 0
is cached (otherwise it is retired at once: slot freed, id recyclable); a running
(not swapped) sequence has all its blocks on DEVICE.

Eviction is a cascade down the tiers: to free DEVICE slots, the policy's worst
unreferenced cached DEVICE blocks are demoted to HOST as far as HOST has room
(HOST first making room the same way, towards NVME), and the rest are dropped.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from array import array
from dataclasses import dataclass
from typing import Callable, Sequence

from wicore.hmt.policy import EvictionPolicy, Tier


@dataclass(frozen=True)
class Move:
    """Copy one block's bytes from `src` to `dst` ((tier, slot) each); dst None = dropped, no copy."""

    block_id: int
    src: tuple[Tier, int]
    dst: tuple[Tier, int] | None


@dataclass(frozen=True)
class Allocation:
    """A new sequence's blocks: its first `num_cached_tokens` prompt tokens need no compute.

    `moves` (promotions of reused blocks to DEVICE, and the demotions/drops that made
    room) must be executed, in order, before the step runs.
    """

    num_cached_tokens: int
    moves: list[Move]


@dataclass(frozen=True)
class BlockInfo:
    """A snapshot of one live block (for metrics, debugging and tests)."""

    block_id: int
    tier: Tier
    slot: int
    ref_count: int
    is_cached: bool


@dataclass
class _Block:
    block_id: int
    tier: Tier
    slot: int
    ref_count: int = 0
    hash: bytes | None = None  # set only while the prefix cache maps this hash to this block


@dataclass
class _Sequence:
    block_ids: list[int]
    num_hashed: int  # leading blocks whose chain hash is known (cached here or held by another block)
    last_hash: bytes  # chain hash of block num_hashed - 1 (b"" before the first block)
    is_swapped: bool = False


class BlockPool:
    """Free lists, refcounts, block tables and the prefix cache of a three-tier paged KV pool."""

    SINK_SLOT = 0  # DEVICE slot for padding rows' writes; never handed out

    def __init__(
        self,
        num_device_blocks: int,
        num_host_blocks: int,
        num_nvme_blocks: int,
        block_size: int,
        policy: EvictionPolicy,
        enable_prefix_cache: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_device_blocks < 2:
            raise ValueError(f"num_device_blocks must be >= 2 (slot 0 is the padding sink), got {num_device_blocks}")
        if num_host_blocks < 0 or num_nvme_blocks < 0:
            raise ValueError(f"host and NVMe block counts must be >= 0, got {num_host_blocks} and {num_nvme_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.policy = policy
        self.enable_prefix_cache = enable_prefix_cache
        self._clock = clock
        # Sorted lists are heaps: the lowest free slot is handed out first.
        self._free_slots = {
            Tier.DEVICE: list(range(self.SINK_SLOT + 1, num_device_blocks)),
            Tier.HOST: list(range(num_host_blocks)),
            Tier.NVME: list(range(num_nvme_blocks)),
        }
        self._num_slots = {t: len(slots) for t, slots in self._free_slots.items()}
        self._evictable: dict[Tier, set[int]] = {t: set() for t in Tier}
        self._blocks: dict[int, _Block] = {}
        self._cache: dict[bytes, int] = {}  # chain hash -> block id
        self._seqs: dict[int, _Sequence] = {}
        self._free_ids: list[int] = []  # heap of retired block ids, recycled lowest first
        self._next_id = 0

    # -- queries ---------------------------------------------------------------------------
    def num_slots(self, tier: Tier) -> int:
        """Usable slots of the tier (DEVICE: all but the sink)."""
        return self._num_slots[tier]

    def num_free(self, tier: Tier) -> int:
        """Slots neither owned by a sequence nor holding a cached block."""
        return len(self._free_slots[tier])

    def num_evictable(self, tier: Tier) -> int:
        """Cached blocks with ref_count 0 in the tier."""
        return len(self._evictable[tier])

    def usage(self, tier: Tier) -> int:
        """Slots in use in the tier (owned or cached)."""
        return self._num_slots[tier] - self.num_free(tier)

    def block_ids(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).block_ids)

    def block_table(self, seq_id: int) -> list[int]:
        """DEVICE slots of the sequence's blocks, in token order."""
        slots = []
        for block_id in self._seq(seq_id).block_ids:
            block = self._blocks[block_id]
            if block.tier is not Tier.DEVICE:
                raise ValueError(f"sequence {seq_id}: block {block_id} is in {block.tier.name}; swap_in first")
            slots.append(block.slot)
        return slots

    def tier_of(self, block_id: int) -> Tier:
        return self._block(block_id).tier

    def slot_of(self, block_id: int) -> int:
        return self._block(block_id).slot

    def ref_count(self, block_id: int) -> int:
        return self._block(block_id).ref_count

    def is_swapped(self, seq_id: int) -> bool:
        return self._seq(seq_id).is_swapped

    def blocks(self) -> list[BlockInfo]:
        """Every live block (owned or cached), by id."""
        return [
            BlockInfo(b.block_id, b.tier, b.slot, b.ref_count, b.hash is not None)
            for b in sorted(self._blocks.values(), key=lambda b: b.block_id)
        ]

    def can_allocate(self, num_new_blocks: int) -> bool:
        """Whether DEVICE can take `num_new_blocks` more, demoting or dropping cached blocks as needed."""
        return num_new_blocks <= self._room(Tier.DEVICE)

    # -- sequences -------------------------------------------------------------------------
    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> Allocation | None:
        """Blocks for a new sequence's prompt: the longest cached run of leading full blocks
        (in any tier; at most (len - 1) // block_size of them, so the last prompt token is
        always computed) is reused, the rest are fresh DEVICE blocks.

        None (and nothing changed) if DEVICE cannot hold them even after evicting.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already has blocks; free it first")
        if not token_ids:
            raise ValueError(f"sequence {seq_id}: a prompt needs at least one token")
        hit_ids, last_hash = self._prefix_hits(token_ids)
        num_new = self._num_blocks(len(token_ids)) - len(hit_ids)
        away_ids = [b for b in hit_ids if self._blocks[b].tier is not Tier.DEVICE]
        num_pinned = len(self._evictable[Tier.DEVICE].intersection(hit_ids))  # reused, so no longer evictable
        if num_new + len(away_ids) > self._room(Tier.DEVICE) - num_pinned:
            return None
        now = self._clock()
        for block_id in hit_ids:
            self._acquire(block_id, now)
        moves = self._to_device(away_ids, num_new, now)
        new_ids = [self._new_block(now) for _ in range(num_new)]
        self._seqs[seq_id] = _Sequence(hit_ids + new_ids, len(hit_ids), last_hash)
        return Allocation(len(hit_ids) * self.block_size, moves)

    def append(self, seq_id: int, num_tokens_total: int) -> list[Move] | None:
        """Add DEVICE blocks at the end until the sequence can hold `num_tokens_total` tokens.

        None (nothing changed) when DEVICE cannot hold them even after evicting.
        """
        seq = self._running(seq_id)
        num_new = self._num_blocks(num_tokens_total) - len(seq.block_ids)
        if num_new <= 0:
            return []
        if num_new > self._room(Tier.DEVICE):
            return None
        now = self._clock()
        moves = self._make_room(Tier.DEVICE, num_new, now)
        seq.block_ids += [self._new_block(now) for _ in range(num_new)]
        return moves

    def commit(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """The first `num_computed` of the sequence's tokens (`token_ids`: all so far) have KV
        written: each newly full block among them gets its chain hash and enters the prefix
        cache, unless another block already holds that hash (this one then stays private).
        """
        seq = self._seq(seq_id)
        if not 0 <= num_computed <= len(token_ids):
            raise ValueError(f"sequence {seq_id}: num_computed {num_computed} outside 0..{len(token_ids)}")
        num_full = num_computed // self.block_size
        if num_full > len(seq.block_ids):
            raise ValueError(f"sequence {seq_id}: {num_computed} tokens need more than its {len(seq.block_ids)} blocks")
        if not self.enable_prefix_cache:
            return
        for i in range(seq.num_hashed, num_full):
            seq.last_hash = self._chain_hash(seq.last_hash, token_ids, i)
            seq.num_hashed = i + 1
            if seq.last_hash not in self._cache:
                self._cache[seq.last_hash] = seq.block_ids[i]
                self._blocks[seq.block_ids[i]].hash = seq.last_hash

    def free(self, seq_id: int) -> None:
        """The sequence ends or is aborted: its blocks lose one reference. Cached blocks left
        unreferenced stay (evictable); others are retired. Every block it held counts as used now.
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        now = self._clock()
        for block_id in seq.block_ids:
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0 and block.hash is None:
                self._retire(block)
                continue
            self.policy.touch(block_id, now)
            if block.ref_count == 0:
                self._evictable[block.tier].add(block_id)

    def swap_out(self, seq_id: int) -> list[Move] | None:
        """Preempt by swap: the blocks only this sequence holds go to HOST, then NVME once HOST
        is full (evicting cached blocks of those tiers as needed); shared blocks stay on DEVICE.

        None (nothing changed) if the lower tiers cannot hold them: preempt by recompute (free).
        """
        seq = self._running(seq_id)
        private_ids = [b for b in seq.block_ids if self._blocks[b].ref_count == 1]
        host_room = self._room(Tier.HOST)
        if len(private_ids) > host_room + self._room(Tier.NVME):
            return None
        num_host = min(len(private_ids), host_room)
        now = self._clock()
        # NVME first, so that HOST's own evictions cascade only into what NVME has left.
        moves = self._make_room(Tier.NVME, len(private_ids) - num_host, now)
        for block_id in private_ids[num_host:]:
            self._relocate(block_id, Tier.NVME, moves)
        moves += self._make_room(Tier.HOST, num_host, now)
        for block_id in private_ids[:num_host]:
            self._relocate(block_id, Tier.HOST, moves)
        seq.is_swapped = True
        return moves

    def swap_in(self, seq_id: int) -> list[Move] | None:
        """Bring all the sequence's blocks back to DEVICE; None (nothing changed) if it cannot hold them."""
        seq = self._seq(seq_id)
        if not seq.is_swapped:
            raise ValueError(f"sequence {seq_id} is not swapped out")
        away_ids = [b for b in seq.block_ids if self._blocks[b].tier is not Tier.DEVICE]
        if len(away_ids) > self._room(Tier.DEVICE):
            return None
        moves = self._to_device(away_ids, 0, self._clock())
        seq.is_swapped = False
        return moves

    def invalidate(self, block_id: int) -> None:
        """The block's bytes are corrupt: it leaves the prefix cache now. Holders keep their
        reference (the caller recomputes them: free + add again); its slot is freed when the
        last one lets go. A block id no longer live has nothing to invalidate.
        """
        block = self._blocks.get(block_id)
        if block is None:
            return
        self._uncache(block)
        if block.ref_count == 0:
            self._retire(block)

    # -- helpers ---------------------------------------------------------------------------
    def _seq(self, seq_id: int) -> _Sequence:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id}")
        return seq

    def _running(self, seq_id: int) -> _Sequence:
        seq = self._seq(seq_id)
        if seq.is_swapped:
            raise ValueError(f"sequence {seq_id} is swapped out; swap_in first")
        return seq

    def _block(self, block_id: int) -> _Block:
        block = self._blocks.get(block_id)
        if block is None:
            raise KeyError(f"unknown block {block_id}")
        return block

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _room(self, tier: Tier) -> int:
        """Slots the tier can give: free ones plus those of its evictable cached blocks."""
        return self.num_free(tier) + self.num_evictable(tier)

    def _lower(self, tier: Tier) -> Tier | None:
        """The next tier down that exists (has slots), where the tier's victims are demoted."""
        return next((t for t in Tier if t > tier and self._num_slots[t] > 0), None)

    def _prefix_hits(self, token_ids: Sequence[int]) -> tuple[list[int], bytes]:
        """Cached blocks of the prompt's longest cached run of leading full blocks (leaving at
        least the last token to compute), and the chain hash of the last of them."""
        hit_ids: list[int] = []
        parent = b""
        if not self.enable_prefix_cache:
            return hit_ids, parent
        for i in range((len(token_ids) - 1) // self.block_size):
            block_hash = self._chain_hash(parent, token_ids, i)
            block_id = self._cache.get(block_hash)
            if block_id is None:
                break
            hit_ids.append(block_id)
            parent = block_hash
        return hit_ids, parent

    def _make_room(self, tier: Tier, num_slots: int, now: float) -> list[Move]:
        """Evict cached blocks until `tier` has `num_slots` free slots (the caller checked that
        free + evictable suffice); return the moves, in execution order.

        The policy picks the victims; the best of them are demoted one tier down as far as
        that tier has room (it first makes room the same way), the worst are dropped.
        """
        moves: list[Move] = []
        shortfall = num_slots - self.num_free(tier)
        if shortfall <= 0:
            return moves
        victims = self.policy.order(self._evictable[tier], now)[:shortfall]
        assert len(victims) == shortfall, f"{tier.name}: {shortfall} slots wanted, the caller checked the room"
        lower = self._lower(tier)
        num_demoted = 0 if lower is None else min(shortfall, self._room(lower))
        if lower is not None:
            moves += self._make_room(lower, num_demoted, now)
        num_dropped = shortfall - num_demoted
        for block_id in victims[:num_dropped]:
            self._drop(block_id, moves)
        for block_id in victims[num_dropped:]:
            self._relocate(block_id, lower, moves)
        return moves

    def _to_device(self, block_ids: list[int], num_new: int, now: float) -> list[Move]:
        """Make DEVICE room for `block_ids` (held elsewhere) and `num_new` fresh blocks, then move
        the blocks up; the fresh blocks are the caller's to create."""
        moves = self._make_room(Tier.DEVICE, len(block_ids) + num_new, now)
        for block_id in block_ids:
            self._relocate(block_id, Tier.DEVICE, moves)
        return moves

    def _relocate(self, block_id: int, dst: Tier, moves: list[Move]) -> None:
        """Move the block to the lowest free slot of `dst` (the caller made room)."""
        block = self._blocks[block_id]
        slot = heapq.heappop(self._free_slots[dst])
        moves.append(Move(block_id, (block.tier, block.slot), (dst, slot)))
        heapq.heappush(self._free_slots[block.tier], block.slot)
        if block_id in self._evictable[block.tier]:
            self._evictable[block.tier].remove(block_id)
            self._evictable[dst].add(block_id)
        block.tier, block.slot = dst, slot

    def _drop(self, block_id: int, moves: list[Move]) -> None:
        """Discard an unreferenced cached block: out of the cache, slot and id freed."""
        block = self._blocks[block_id]
        moves.append(Move(block_id, (block.tier, block.slot), None))
        self._uncache(block)
        self._retire(block)

    def _uncache(self, block: _Block) -> None:
        if block.hash is not None:
            del self._cache[block.hash]
            block.hash = None

    def _retire(self, block: _Block) -> None:
        """Free the block's slot and id; the block must be unreferenced and out of the cache."""
        self._evictable[block.tier].discard(block.block_id)
        heapq.heappush(self._free_slots[block.tier], block.slot)
        heapq.heappush(self._free_ids, block.block_id)
        del self._blocks[block.block_id]
        self.policy.forget(block.block_id)

    def _acquire(self, block_id: int, now: float) -> None:
        """A prefix hit: one more reference, so the block is no longer evictable."""
        block = self._blocks[block_id]
        block.ref_count += 1
        self._evictable[block.tier].discard(block_id)
        self.policy.touch(block_id, now)

    def _new_block(self, now: float) -> int:
        """A fresh DEVICE block with one reference (the caller made room)."""
        if self._free_ids:
            block_id = heapq.heappop(self._free_ids)
        else:
            block_id, self._next_id = self._next_id, self._next_id + 1
        slot = heapq.heappop(self._free_slots[Tier.DEVICE])
        self._blocks[block_id] = _Block(block_id, Tier.DEVICE, slot, ref_count=1)
        self.policy.touch(block_id, now)
        return block_id

    def _chain_hash(self, parent: bytes, token_ids: Sequence[int], index: int) -> bytes:
        """sha256 of the parent block's chain hash and the token ids (int64) of block `index`.

        A cryptographic hash, not Python's 64-bit hash(): a collision would serve one
        prompt another prompt's KV.
        """
        block_tokens = token_ids[index * self.block_size : (index + 1) * self.block_size]
        return hashlib.sha256(parent + array("q", block_tokens).tobytes()).digest()
