"""Integer bookkeeping for the paged KV cache over three tiers: ids, frames, refcounts, prefix hashes.

No bytes move here. A call that needs bytes moved returns a plan, a list of
`Move`s, which the pager executes in list order before the step runs: a plan may
hand out a frame that an earlier move of the same plan vacated.

A *block* holds the K/V of `block_size` consecutive tokens of a sequence and keeps
its `block_id` for as long as it lives; it lies in one tier at a *frame* (an index
into that tier's store; a *slot*, in the graphs, is one token's place in a DEVICE buffer,
frame * block_size + offset). A sequence of 10 tokens, block_size 4, 8 computed:

    tokens      | t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 .  .  |
    block_ids   |      7      |      2      |      5      |  block_table: their DEVICE frames
    chain hash  |     h0      |     h1      |   (none)    |  h0 = H(b"", t0..t3), h1 = H(h0, t4..t7)
                |<-- num_computed = 8 ----->|

Only full, computed blocks enter the prefix cache (chain hash -> block); a prompt
whose leading blocks hash the same reuses them (ref_count + 1). A block whose KV depends on
more than its tokens (an image's soft tokens: the same ids for every image) is hashed with
`extra_keys[i]` too (the image's digest), given when the sequence is allocated.

A pool may serve sliding-window layers (wicore.kv.cache): a sequence then
releases its leading blocks as they fall out of the window (`release`), and its
live blocks start at logical block `first_block` (the window table).

A pool may *offload* (the full-attention group, when the engine stages KV per step:
wicore.kv.offload): a running sequence then keeps blocks on DEVICE or HOST. New blocks
take DEVICE room first and HOST room after it; when a sequence grows and DEVICE is full of
referenced blocks, the policy's worst of its own DEVICE blocks (never its last, the one being
written) spill to HOST so that the new tail lies on DEVICE. Nothing of a running sequence
stays on NVME: a reused or swapped-in NVME block is lifted to HOST (or DEVICE).

Where blocks lie, eviction and the tier states: wicore.blocks.block_space; a sequence's record and
the chain hash: wicore.blocks.sequence_blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from wicore.blocks.block_space import BlockInfo, BlockSpace, Move
from wicore.blocks.policy import EvictionPolicy
from wicore.blocks.sequence_blocks import Allocation, SequenceBlocks, block_tokens, chain_hash, prefix_hashes
from wicore.blocks.tier import Tier

__all__ = ["Allocation", "BlockInfo", "BlockPool", "Move"]


class BlockPool(BlockSpace):
    """Free lists, refcounts, block tables and the prefix cache of a three-tier paged KV pool."""

    def __init__(
        self,
        num_device_blocks: int,
        num_host_blocks: int,
        num_nvme_blocks: int,
        block_size: int,
        policy: EvictionPolicy,
        enable_prefix_cache: bool = True,
        clock: Callable[[], float] = time.monotonic,
        group: int = 0,
        offload: bool = False,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        super().__init__(num_device_blocks, num_host_blocks, num_nvme_blocks, policy, clock, group)
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.offload = offload  # running sequences may keep blocks on HOST (module docstring)
        self._seqs: dict[int, SequenceBlocks] = {}

    # -- queries ---------------------------------------------------------------------------
    def seq_ids(self) -> list[int]:
        """The sequences that hold blocks here."""
        return list(self._seqs)

    def add_attention(self, block_id: int, mass: float, now: float) -> None:
        """The block received `mass` attention in a step (A2CR's signal; see wicore.blocks.policy)."""
        self.policy.add_attention(block_id, mass, now)

    def block_ids(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).block_ids)

    def num_blocks_in(self, seq_id: int, tier: Tier) -> int:
        """How many of the sequence's blocks are in `tier` (a swapped sequence keeps on DEVICE
        the blocks it shared with running ones)."""
        return sum(self._blocks[b].tier is tier for b in self._seq(seq_id).block_ids)

    def first_block(self, seq_id: int) -> int:
        """Logical index of the sequence's first live block (0 unless blocks were released)."""
        return self._seq(seq_id).first_block

    def block_table(self, seq_id: int) -> list[int]:
        """DEVICE frames of the sequence's live blocks, in token order."""
        seq = self._seq(seq_id)
        if seq.frames is None or seq.frames_version != self.layout_version:
            frames = []
            for block_id in seq.block_ids:
                block = self._blocks[block_id]
                if block.tier is not Tier.DEVICE:
                    raise ValueError(f"sequence {seq_id}: block {block_id} is in {block.tier.name}; swap_in first")
                frames.append(block.frame)
            seq.frames, seq.frames_version = frames, self.layout_version
        return list(seq.frames)

    def block_locations(self, seq_id: int) -> list[tuple[Tier, int]]:
        """(tier, frame) of the sequence's live blocks, in token order (an offloading pool's tables)."""
        return [(self._blocks[b].tier, self._blocks[b].frame) for b in self._seq(seq_id).block_ids]

    def is_offloaded(self, seq_id: int) -> bool:
        """Whether the (running) sequence has blocks off DEVICE: its step must stage them."""
        if not self.offload:  # asked for every row of every step: a pool that does not offload answers at once
            return False
        seq = self._seq(seq_id)
        return not seq.is_swapped and any(self._blocks[b].tier is not Tier.DEVICE for b in seq.block_ids)

    def is_swapped(self, seq_id: int) -> bool:
        return self._seq(seq_id).is_swapped

    # -- sequences -------------------------------------------------------------------------
    def allocate(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        num_hits: int | None = None,
        first_block: int = 0,
        num_tokens: int | None = None,
        hashes: Sequence[bytes] | None = None,
        extra_keys: Mapping[int, bytes] | None = None,
    ) -> Allocation | None:
        """Blocks for a new sequence's prompt: the longest cached run of leading full blocks
        (in any tier; at most (len - 1) // block_size of them, so the last prompt token is
        always computed) is reused, the rest are fresh DEVICE blocks.

        A caller coordinating several pools (wicore.kv.cache) decides instead: blocks
        [first_block, num_hits) are reused (all must be cached: see `is_cached`), the ones
        before `first_block` are not held at all, and fresh blocks are added for the first
        `num_tokens` tokens only (the rest come with `append`). `hashes`, the prompt's
        `prefix_hashes`, saves hashing it again when the caller already has them. `extra_keys`
        (logical block -> bytes) are hashed with the blocks' tokens, here and when they are committed.

        None (and nothing changed) if DEVICE cannot hold them even after evicting.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already has blocks; free it first")
        if not token_ids:
            raise ValueError(f"sequence {seq_id}: a prompt needs at least one token")
        extra_keys = extra_keys or {}
        hashes = self.prefix_hashes(token_ids, extra_keys) if hashes is None else hashes
        if num_hits is None:
            num_hits = self.num_leading_hits(hashes)
        if not 0 <= first_block <= num_hits <= len(hashes):
            raise ValueError(f"sequence {seq_id}: hits [{first_block}, {num_hits}) outside 0..{len(hashes)}")
        hit_ids = [self._cache[h] for h in hashes[first_block:num_hits]]
        num_new = self._num_blocks(len(token_ids) if num_tokens is None else num_tokens) - num_hits
        if num_new < 0:
            raise ValueError(f"sequence {seq_id}: {num_tokens} tokens is fewer than its {num_hits} cached blocks")
        if not self._can_hold(hit_ids, num_new):
            return None
        now = self._clock()
        for block_id in hit_ids:
            self._acquire(block_id, now)
        if self.offload:
            moves = self._lift([b for b in hit_ids if self._blocks[b].tier is Tier.NVME], now)
            new_ids = self._offload_blocks(num_hits, num_new, now, moves)
        else:
            away_ids = [b for b in hit_ids if self._blocks[b].tier is not Tier.DEVICE]
            moves = self._to_device(away_ids, num_new, now)
            new_ids = [self._new_block(now, num_hits + i) for i in range(num_new)]
        last_hash = hashes[num_hits - 1] if num_hits else b""
        self._seqs[seq_id] = SequenceBlocks(
            hit_ids + new_ids, num_hits, last_hash, first_block=first_block, extra_keys=extra_keys
        )
        return Allocation(num_hits * self.block_size, moves)

    def can_allocate_prefix(
        self,
        token_ids: Sequence[int],
        num_hits: int,
        first_block: int = 0,
        num_tokens: int | None = None,
        hashes: Sequence[bytes] | None = None,
    ) -> bool:
        """Whether `allocate(.., token_ids, num_hits, first_block, num_tokens)` would succeed now."""
        hashes = self.prefix_hashes(token_ids) if hashes is None else hashes
        hit_ids = [self._cache[h] for h in hashes[first_block:num_hits]]
        return self._can_hold(hit_ids, self._num_blocks(len(token_ids) if num_tokens is None else num_tokens) - num_hits)

    def prefix_hashes(self, token_ids: Sequence[int], extra_keys: Mapping[int, bytes] | None = None) -> list[bytes]:
        """Chain hashes of the prompt's leading full blocks that could be reused: all but the
        block of the last token, which is always computed (empty with the cache off)."""
        return prefix_hashes(token_ids, self.block_size, extra_keys) if self.enable_prefix_cache else []

    def is_cached(self, block_hash: bytes) -> bool:
        return block_hash in self._cache

    def num_leading_hits(self, hashes: Sequence[bytes]) -> int:
        """How many of `hashes`, from the first, are cached."""
        return next((i for i, h in enumerate(hashes) if h not in self._cache), len(hashes))

    def append(self, seq_id: int, num_tokens_total: int) -> list[Move] | None:
        """Add DEVICE blocks at the end until the sequence can hold `num_tokens_total` tokens.

        None (nothing changed) when DEVICE cannot hold them even after evicting.
        """
        seq = self._running(seq_id)
        num_new = self._num_blocks(num_tokens_total) - seq.num_blocks
        if num_new <= 0:
            return []
        if not self.can_append(seq_id, num_tokens_total):
            return None
        now = self._clock()
        if self.offload:
            moves = self._spill(seq, num_new - self._room(Tier.DEVICE), now)
            seq.block_ids += self._offload_blocks(seq.num_blocks, num_new, now, moves)
            seq.frames = None
            return moves
        moves = self._make_room(Tier.DEVICE, num_new, now)
        new_ids = [self._new_block(now, seq.num_blocks + i) for i in range(num_new)]
        seq.block_ids += new_ids
        if seq.frames is not None:  # fresh DEVICE blocks: the cached table grows by their frames
            seq.frames += [self._blocks[b].frame for b in new_ids]
        return moves

    def holds(self, seq_id: int, first_block: int, num_tokens_total: int) -> bool:
        """Whether the (running) sequence's live blocks are already those from logical block
        `first_block` to `num_tokens_total` tokens: `release(seq_id, first_block)` and
        `append(seq_id, num_tokens_total)` would change nothing (most decode rows)."""
        seq = self._seqs.get(seq_id)  # asked for every decode row: _running's calls only for its errors
        if seq is None or seq.is_swapped:
            seq = self._running(seq_id)
        num_blocks = seq.first_block + len(seq.block_ids)  # seq.num_blocks, inlined
        return -(-num_tokens_total // self.block_size) <= num_blocks and min(first_block, num_blocks) <= seq.first_block

    def can_append(self, seq_id: int, num_tokens_total: int) -> bool:
        """Whether `append(seq_id, num_tokens_total)` would succeed now."""
        num_new = self._num_blocks(num_tokens_total) - self._running(seq_id).num_blocks
        if num_new <= 0:  # most decode rows: no room to count
            return True
        return num_new <= self._room(Tier.DEVICE) + (self._room(Tier.HOST) if self.offload else 0)

    def truncate(self, seq_id: int, num_tokens_total: int) -> None:
        """Drop the blocks past those `num_tokens_total` tokens need (a speculative row's
        rejected tokens): they were never committed, so they hold no prefix hash and retire."""
        seq = self._running(seq_id)
        num_kept = max(self._num_blocks(num_tokens_total) - seq.first_block, 0)
        dropped, seq.block_ids = seq.block_ids[num_kept:], seq.block_ids[:num_kept]
        if seq.frames is not None:
            del seq.frames[num_kept:]
        assert all(self._blocks[b].hash is None for b in dropped), "committed blocks are never rolled back"
        self._unref(dropped, self._clock())

    def release(self, seq_id: int, first_block: int) -> None:
        """The sequence no longer reads its logical blocks before `first_block` (they left the
        sliding window): each loses its reference, as in `free`. Cached ones stay (evictable)
        for prefix hits of other prompts; the others are retired now."""
        seq = self._running(seq_id)
        num_released = min(first_block, seq.num_blocks) - seq.first_block
        if num_released <= 0:
            return
        released, seq.block_ids = seq.block_ids[:num_released], seq.block_ids[num_released:]
        if seq.frames is not None:
            del seq.frames[:num_released]
        seq.first_block += num_released
        self._unref(released, self._clock())

    def commit(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """The first `num_computed` of the sequence's tokens (`token_ids`: all so far) have KV
        written: each newly full block among them gets its chain hash and enters the prefix
        cache, unless another block already holds that hash (this one then stays private).
        """
        seq = self._seq(seq_id)
        if not 0 <= num_computed <= len(token_ids):
            raise ValueError(f"sequence {seq_id}: num_computed {num_computed} outside 0..{len(token_ids)}")
        num_full = num_computed // self.block_size
        if num_full > seq.num_blocks:
            raise ValueError(f"sequence {seq_id}: {num_computed} tokens need more than its {seq.num_blocks} blocks")
        if not self.enable_prefix_cache:
            return
        for i in range(seq.num_hashed, num_full):
            seq.last_hash = chain_hash(seq.last_hash, block_tokens(token_ids, self.block_size, i), seq.extra_keys.get(i, b""))
            seq.num_hashed = i + 1
            if i >= seq.first_block and seq.last_hash not in self._cache:
                block_id = seq.block_ids[i - seq.first_block]
                self._cache[seq.last_hash] = block_id
                self._blocks[block_id].hash = seq.last_hash

    def free(self, seq_id: int) -> None:
        """The sequence ends or is aborted: its blocks lose one reference. Cached blocks left
        unreferenced stay (evictable); others are retired. Every block it held counts as used now.
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self._unref(seq.block_ids, self._clock())

    def swap_out(self, seq_id: int) -> list[Move] | None:
        """Preempt by swap: the blocks only this sequence holds go to HOST, then NVME once HOST
        is full (evicting cached blocks of those tiers as needed); shared blocks stay on DEVICE.

        None (nothing changed) if the lower tiers cannot hold them: preempt by recompute (free).
        """
        seq = self._running(seq_id)
        if not self.can_swap_out(seq_id):
            return None
        private_ids = self._private_device_blocks(seq)
        host_room = self._room(Tier.HOST)
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

    def can_swap_out(self, seq_id: int) -> bool:
        """Whether HOST and NVME can take the DEVICE blocks only this (running) sequence holds."""
        private = len(self._private_device_blocks(self._running(seq_id)))
        return private <= self._room(Tier.HOST) + self._room(Tier.NVME)

    def can_swap_in(self, seq_id: int) -> bool:
        """Whether DEVICE can take back all the (swapped) sequence's blocks (an offloading pool: its
        NVME ones, DEVICE and HOST together)."""
        seq = self._seq(seq_id)
        if self.offload:
            return self._num_in(seq, Tier.NVME) <= self._room(Tier.DEVICE) + self._room(Tier.HOST)
        return len(seq.block_ids) - self._num_in(seq, Tier.DEVICE) <= self._room(Tier.DEVICE)

    def swap_in(self, seq_id: int) -> list[Move] | None:
        """Bring all the sequence's blocks back to DEVICE; None (nothing changed) if it cannot hold
        them. An offloading pool lifts its NVME blocks and brings HOST ones up into free DEVICE frames."""
        seq = self._seq(seq_id)
        if not seq.is_swapped:
            raise ValueError(f"sequence {seq_id} is not swapped out")
        if not self.can_swap_in(seq_id):
            return None
        now = self._clock()
        if self.offload:
            moves = self._lift([b for b in seq.block_ids if self._blocks[b].tier is Tier.NVME], now)
            for block_id in seq.block_ids:
                if self._blocks[block_id].tier is Tier.HOST and self.num_free(Tier.DEVICE):
                    self._relocate(block_id, Tier.DEVICE, moves)
        else:
            moves = self._to_device([b for b in seq.block_ids if self._blocks[b].tier is not Tier.DEVICE], 0, now)
        seq.is_swapped = False
        return moves

    def invalidate(self, block_id: int) -> None:
        """The block's bytes are corrupt: it leaves the prefix cache now. Holders keep their
        reference (the caller recomputes them: free + add again); its frame is freed when the
        last one lets go. A block id no longer live has nothing to invalidate.
        """
        block = self._blocks.get(block_id)
        if block is None:
            return
        self._uncache(block)
        if block.ref_count == 0:
            self._retire(block)

    # -- helpers ---------------------------------------------------------------------------
    def _seq(self, seq_id: int) -> SequenceBlocks:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id}")
        return seq

    def _running(self, seq_id: int) -> SequenceBlocks:
        seq = self._seq(seq_id)
        if seq.is_swapped:
            raise ValueError(f"sequence {seq_id} is swapped out; swap_in first")
        return seq

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _num_in(self, seq: SequenceBlocks, tier: Tier) -> int:
        return sum(self._blocks[b].tier is tier for b in seq.block_ids)

    def _private_device_blocks(self, seq: SequenceBlocks) -> list[int]:
        return [b for b in seq.block_ids if self._blocks[b].ref_count == 1 and self._blocks[b].tier is Tier.DEVICE]

    def _can_hold(self, hit_ids: list[int], num_new: int) -> bool:
        """Whether `num_new` fresh blocks and the reused `hit_ids` fit: on DEVICE, or (offloading) on
        DEVICE and HOST together, less the cached blocks the hits pin and the NVME hits to lift."""
        if not self.offload:
            return self._fits(hit_ids, num_new)
        pinned = sum(b in self._evictable[t] for b in hit_ids for t in (Tier.DEVICE, Tier.HOST))
        num_nvme = sum(self._blocks[b].tier is Tier.NVME for b in hit_ids)
        return num_new + num_nvme <= self._room(Tier.DEVICE) + self._room(Tier.HOST) - pinned

    def _spill(self, seq: SequenceBlocks, num_frames: int, now: float) -> list[Move]:
        """Free up to `num_frames` DEVICE frames for an offloaded sequence's new tail: its own DEVICE
        blocks but the last, the policy's worst first, move to HOST (which makes room first)."""
        if num_frames <= 0:
            return []
        own = [b for b in seq.block_ids[:-1] if self._blocks[b].tier is Tier.DEVICE]
        victims = self.policy.order(own, now)[: min(num_frames, self._room(Tier.HOST))]
        moves = self._make_room(Tier.HOST, len(victims), now)
        for block_id in victims:
            self._relocate(block_id, Tier.HOST, moves)
        return moves
