"""The block bookkeeping of one model as block groups: full-attention layers and sliding-window layers.

Gemma 3 interleaves sliding-window layers (a query sees the last `window` tokens) with
full-attention layers. Each kind keeps its K/V in a block group of its own: a BlockPool
over its own pools and tier stores. A sequence has one block table per group, over the
same tokens and the same logical blocks:

    logical block      | 0 | 1 | 2 | 3 | 4 | 5 | 6 |      next query at position p
    full group         | a | b | c | d | e | f | g |      every block, for the whole context
    window group       | . | . | . | w | x | y | z |      from first_block = (p - window + 1) // bs

The window group releases a sequence's blocks as they fall behind the window, so at long
context the sliding layers cost the window, not the context. Released blocks that are in
the prefix cache stay there (unreferenced, evictable) for later prompts.

A prompt reuses its first k blocks only if every group can serve them: the full group
caches blocks [0, k) and the window group [first(k), k), the blocks the first token to
compute (position k * bs) still sees. Every call either changes all groups or none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from wicore.blocks.block_pool import Allocation, BlockPool, Move
from wicore.blocks.tier import Tier

FULL, WINDOW = 0, 1  # group ids, stamped on their Moves


@dataclass(frozen=True)
class KVGroup:
    pool: BlockPool
    window: int | None  # tokens a query sees; None: full attention

    def first_needed(self, position: int) -> int:
        """Logical block of the oldest key a query at `position` still sees."""
        if self.window is None:
            return 0
        return max(0, (position - self.window + 1) // self.pool.block_size)


class BlockGroups:
    """The block groups of one model, driven together: integers only (wicore.kv.cache adds the bytes)."""

    def __init__(self, full: BlockPool, window_pool: BlockPool | None = None, window: int | None = None) -> None:
        if (window_pool is None) != (window is None):
            raise ValueError("a window group needs both its pool and its window size")
        if window_pool is not None and window_pool.block_size != full.block_size:
            raise ValueError("the block groups must share one block size")
        self.full = KVGroup(full, None)
        self.groups = [self.full] + ([KVGroup(window_pool, window)] if window_pool is not None else [])
        self.block_size = full.block_size

    @property
    def window(self) -> KVGroup | None:
        return self.groups[WINDOW] if len(self.groups) > 1 else None

    @property
    def prefix_cache_enabled(self) -> bool:
        return self.full.pool.enable_prefix_cache

    # -- sequences -------------------------------------------------------------------
    def allocate(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        max_step_tokens: int,
        reuse_prefix: bool = True,
        extra_keys: Mapping[int, bytes] | None = None,
    ) -> Allocation | None:
        """Blocks for a new sequence: the longest prefix every group has cached is reused (unless
        `reuse_prefix` is False: a request that wants every prompt position's logits); the full
        group gets blocks for the whole prompt, the window group for the first step's tokens (at
        most `max_step_tokens` after the cached ones). `extra_keys`: see BlockPool.allocate.
        None: nothing changed."""
        hashes = self.full.pool.prefix_hashes(token_ids, extra_keys)
        num_hits = self.full.pool.num_leading_hits(hashes) if reuse_prefix else 0
        window = self.window
        while (
            window is not None
            and num_hits
            and not all(window.pool.is_cached(h) for h in hashes[window.first_needed(num_hits * self.block_size) : num_hits])
        ):
            num_hits -= 1
        start = num_hits * self.block_size
        wanted = [
            (g, g.first_needed(start), len(token_ids) if g.window is None else min(len(token_ids), start + max_step_tokens))
            for g in self.groups
        ]
        # The groups share one block size, so one set of chain hashes serves all of them.
        if not all(g.pool.can_allocate_prefix(token_ids, num_hits, first, n, hashes) for g, first, n in wanted):
            return None
        moves: list[Move] = []
        for g, first, n in wanted:
            alloc = g.pool.allocate(seq_id, token_ids, num_hits, first, n, hashes, extra_keys)
            assert alloc is not None, "checked above"
            moves += alloc.moves
        return Allocation(start, moves)

    def append(self, seq_id: int, start: int, num_tokens_total: int) -> list[Move] | None:
        """Make room for the step that computes tokens [start, num_tokens_total): the window
        group first releases what the step's queries no longer see. None: no room (blocks
        released stay released; nothing else changed)."""
        if self.holds(seq_id, start, num_tokens_total):  # most decode rows: nothing to release or add
            return []
        for g in self.groups[1:]:
            g.pool.release(seq_id, g.first_needed(start))
        return self._all(
            lambda pool: pool.can_append(seq_id, num_tokens_total), lambda pool: pool.append(seq_id, num_tokens_total)
        )

    def holds(self, seq_id: int, start: int, num_tokens_total: int) -> bool:
        """Whether `append(seq_id, start, num_tokens_total)` would change nothing: every group already
        holds the blocks the step's tokens need and none it no longer sees (the sequence's block
        tables stay as they are)."""
        for g in self.groups:  # noqa: SIM110 (a loop, not all() over a generator: asked for every decode row)
            if not g.pool.holds(seq_id, g.first_needed(start), num_tokens_total):
                return False
        return True

    def fills_a_block(self, num_computed_before: int, num_computed: int) -> bool:
        """Whether computing tokens [num_computed_before, num_computed) fills a block: `commit` has
        something to do (most decode rows fill none)."""
        return num_computed // self.block_size > num_computed_before // self.block_size

    def truncate(self, seq_id: int, num_tokens_total: int) -> None:
        """Free every group's blocks past the first `num_tokens_total` tokens (rejected draft tokens)."""
        for g in self.groups:
            g.pool.truncate(seq_id, num_tokens_total)

    def commit(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """The first `num_computed` tokens have KV written: the blocks that became full since the last
        commit enter the prefix cache (BlockPool.commit). Where none did (`fills_a_block` False since
        the last commit, or the allocation), it changes nothing: a caller may leave it out."""
        for g in self.groups:
            g.pool.commit(seq_id, token_ids, num_computed)

    def free(self, seq_id: int) -> None:
        for g in self.groups:
            g.pool.free(seq_id)

    def swap_out(self, seq_id: int) -> list[Move] | None:
        return self._all(lambda pool: pool.can_swap_out(seq_id), lambda pool: pool.swap_out(seq_id))

    def swap_in(self, seq_id: int) -> list[Move] | None:
        return self._all(lambda pool: pool.can_swap_in(seq_id), lambda pool: pool.swap_in(seq_id))

    def invalidate(self, group: int, block_id: int) -> None:
        self.groups[group].pool.invalidate(block_id)

    # -- queries ---------------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """The full group's DEVICE frames, every block of the sequence in order."""
        return self.full.pool.block_table(seq_id)

    def window_table(self, seq_id: int) -> tuple[list[int], int]:
        """The window group's DEVICE frames and the logical block of the first; without a
        window group, the full table from block 0 (empty while the sequence is offloaded: the
        runner gives it the staged table)."""
        if self.window is None and self.full.pool.is_offloaded(seq_id):
            return [], 0
        group = self.window or self.full
        return group.pool.block_table(seq_id), group.pool.first_block(seq_id)

    def block_locations(self, seq_id: int) -> list[tuple[Tier, int]]:
        """(tier, frame) of each of the full group's blocks of the sequence (an offloading pool's)."""
        return self.full.pool.block_locations(seq_id)

    def is_offloaded(self, seq_id: int) -> bool:
        """Whether the sequence's full-attention blocks are partly off the device (staged each step)."""
        return self.full.pool.is_offloaded(seq_id)

    def num_full_blocks(self, seq_id: int) -> int:
        """The sequence's full-attention blocks: what a step stages for it when it is offloaded."""
        return len(self.full.pool.block_ids(seq_id))

    def block_ids(self, seq_id: int) -> list[int]:
        """The full group's block ids (what per-block attention statistics refer to)."""
        return self.full.pool.block_ids(seq_id)

    def holders(self, block_keys: set[tuple[int, int]]) -> set[int]:
        """Ids of the sequences holding any of `block_keys` ((group, block id) each)."""
        return {
            s for i, g in enumerate(self.groups) for s in g.pool.seq_ids() if block_keys & {(i, b) for b in g.pool.block_ids(s)}
        }

    def num_blocks_in(self, seq_id: int, tier: Tier) -> int:
        """The sequence's blocks in `tier`, over all groups."""
        return sum(g.pool.num_blocks_in(seq_id, tier) for g in self.groups)

    def _all(self, can: Callable[[BlockPool], bool], call: Callable[[BlockPool], list[Move] | None]) -> list[Move] | None:
        """`call` on every group's pool when `can` holds for each (the plans joined), else None: all or none."""
        if not all(can(g.pool) for g in self.groups):
            return None
        moves: list[Move] = []
        for g in self.groups:
            plan = call(g.pool)
            assert plan is not None, "room was checked for every group"
            moves += plan
        return moves
