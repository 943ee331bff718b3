"""BlockPool on tiny pools (block_size 4): exact block ids, frames, move plans, and a random walk."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from wicore.blocks.block_pool import Allocation, BlockInfo, BlockPool, Move
from wicore.blocks.policy import A2CRPolicy, EvictionPolicy, LRUPolicy
from wicore.blocks.tier import Tier

BS = 4
TOKENS = st.lists(st.integers(0, 1), min_size=1, max_size=10)  # two token ids, so prefixes collide
D, H, N = Tier.DEVICE, Tier.HOST, Tier.NVME
Plan = TypeVar("Plan", Allocation, list[Move])


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_pool(
    device: int = 10, host: int = 0, nvme: int = 0, cache: bool = True, policy: EvictionPolicy | None = None
) -> tuple[BlockPool, FakeClock]:
    clock = FakeClock()
    return BlockPool(device, host, nvme, BS, policy or LRUPolicy(), cache, clock=clock), clock


def cached_prompt(pool: BlockPool, seq_id: int, token_ids: list[int]) -> list[Move]:
    """Run a whole prompt: allocate, commit every token, free. Its full blocks stay cached.
    Returns the allocation's moves."""
    alloc = pool.allocate(seq_id, token_ids)
    assert alloc is not None
    pool.commit(seq_id, token_ids, len(token_ids))
    pool.free(seq_id)
    return alloc.moves


def info(pool: BlockPool, block_id: int) -> BlockInfo:
    """The live block's snapshot (tier, frame, ref_count) among `pool.blocks()`."""
    return next(b for b in pool.blocks() if b.block_id == block_id)


def state(pool: BlockPool) -> tuple[list[BlockInfo], list[int]]:
    return pool.blocks(), [pool.num_free(t) for t in Tier]


# -- frames and ids ---------------------------------------------------------------------------
def test_lowest_free_frame_first_and_the_sink_is_never_handed_out():
    pool, _ = make_pool(device=10)
    assert pool.num_frames(D) == 9 and pool.num_free(D) == 9
    assert pool.allocate(1, list(range(9))) == Allocation(num_cached_tokens=0, moves=[])
    assert pool.block_ids(1) == [0, 1, 2] and pool.block_table(1) == [1, 2, 3]
    assert pool.allocate(2, list(range(5))).num_cached_tokens == 0
    assert pool.block_ids(2) == [3, 4] and pool.block_table(2) == [4, 5]
    assert pool.usage(D) == 5 and pool.num_free(D) == 4
    pool.free(1)  # nothing committed: no block is cached, all three retire
    assert pool.usage(D) == 2 and pool.num_evictable(D) == 0
    pool.allocate(3, [7])
    assert pool.block_ids(3) == [0] and pool.block_table(3) == [1]  # lowest recycled id, lowest frame


def test_append_adds_blocks_only_when_a_block_fills():
    pool, _ = make_pool()
    pool.allocate(1, [1, 2, 3])
    assert pool.append(1, 4) == []
    assert pool.block_ids(1) == [0]
    assert pool.append(1, 9) == []
    assert pool.block_ids(1) == [0, 1, 2] and pool.block_table(1) == [1, 2, 3]


# -- prefix cache ----------------------------------------------------------------------------
def test_prefix_hit_reuses_the_exact_blocks_and_counts_cached_tokens():
    pool, _ = make_pool()
    cached_prompt(pool, 1, list(range(12)))  # blocks 0, 1, 2, all full and cached
    assert pool.num_evictable(D) == 3
    alloc = pool.allocate(2, [0, 1, 2, 3, 4, 5, 6, 7, 50, 51])
    assert alloc.num_cached_tokens == 8 and alloc.moves == []
    assert pool.block_ids(2) == [0, 1, 3] and pool.block_table(2) == [1, 2, 4]
    assert [info(pool, b).ref_count for b in (0, 1, 2, 3)] == [1, 1, 0, 1]
    assert pool.num_evictable(D) == 1


def test_a_running_sibling_shares_its_committed_blocks():
    pool, _ = make_pool()
    pool.allocate(1, list(range(12)))
    pool.commit(1, list(range(12)), 6)  # only the first block is computed and full
    alloc = pool.allocate(2, list(range(12)))
    assert alloc.num_cached_tokens == 4
    assert pool.block_ids(2) == [0, 3, 4] and info(pool, 0).ref_count == 2


def test_a_full_prompt_hit_backs_off_one_block():
    pool, _ = make_pool()
    cached_prompt(pool, 1, list(range(12)))
    assert pool.allocate(2, list(range(12))).num_cached_tokens == 8
    assert pool.block_ids(2) == [0, 1, 3]  # the last block is computed again, in a fresh block
    assert pool.allocate(3, list(range(13))).num_cached_tokens == 12
    assert pool.block_ids(3) == [0, 1, 2, 4]


def test_hashes_are_chained_so_a_block_hits_only_after_the_same_prefix():
    pool, _ = make_pool()
    cached_prompt(pool, 1, [1, 1, 1, 1, 2, 2, 2, 2, 3])
    assert pool.allocate(2, [9, 9, 9, 9, 2, 2, 2, 2, 3]).num_cached_tokens == 0
    assert pool.allocate(3, [1, 1, 1, 1, 2, 2, 2, 9, 3]).num_cached_tokens == 4


def test_extra_keys_tell_blocks_with_the_same_tokens_apart():
    """Block 1 holds an image's tokens (the same ids for every image): it hits only with the same
    extra key (the image's digest), and only blocks after a matching one hit."""
    pool, _ = make_pool()
    tokens = [1, 2, 3, 4, 9, 9, 9, 9, 5, 6, 7, 8, 0]
    alloc = pool.allocate(1, tokens, extra_keys={1: b"cat"})
    assert alloc is not None and alloc.num_cached_tokens == 0
    pool.commit(1, tokens, len(tokens))  # the committed hashes take the keys given at allocation
    pool.free(1)
    assert pool.prefix_hashes(tokens)[0] == pool.prefix_hashes(tokens, {1: b"cat"})[0]  # block 0 has no key
    for seq_id, keys in ((2, {1: b"dog"}), (3, {})):
        assert pool.allocate(seq_id, tokens, extra_keys=keys).num_cached_tokens == 4
        assert pool.block_ids(seq_id)[0] == 0
        pool.free(seq_id)
    assert pool.allocate(4, tokens, extra_keys={1: b"cat"}).num_cached_tokens == 12
    assert pool.block_ids(4)[:3] == [0, 1, 2]


def test_a_duplicate_block_stays_private_and_retires_when_freed():
    pool, _ = make_pool()
    pool.allocate(1, list(range(5)))
    pool.allocate(2, list(range(5)))  # both compute the same first block before either commits
    pool.commit(1, list(range(5)), 5)
    pool.commit(2, list(range(5)), 5)  # block 0 already holds that hash: block 2 stays private
    pool.free(2)
    assert [b.block_id for b in pool.blocks()] == [0, 1]
    pool.free(1)
    assert [(b.block_id, b.is_cached) for b in pool.blocks()] == [(0, True)]


def test_prefix_cache_off_caches_nothing():
    pool, _ = make_pool(cache=False)
    cached_prompt(pool, 1, list(range(12)))
    assert pool.usage(D) == 0
    assert pool.allocate(2, list(range(12))).num_cached_tokens == 0


# -- eviction and demotion -------------------------------------------------------------------
def one_block_prompts(pool: BlockPool, clock: FakeClock, tokens: list[int]) -> None:
    """At t = 1, 2, ...: prompt [t, t, t, t] (one full block, cached), as sequence 100 + t."""
    for token in tokens:
        clock.now = float(token)
        cached_prompt(pool, 100 + token, [token] * BS)


def test_lru_eviction_drops_the_least_recently_used_cached_blocks():
    pool, clock = make_pool(device=6)  # 5 usable frames
    one_block_prompts(pool, clock, [1, 2, 3])  # blocks 0, 1, 2 in frames 1, 2, 3
    clock.now = 4.0
    pool.allocate(4, [1, 1, 1, 1, 9])  # prefix hit on block 0; its tail block 3 retires at free
    clock.now = 5.0
    pool.free(4)  # block 0 last used at t=5: now the most recent
    clock.now = 6.0
    alloc = pool.allocate(5, list(range(16)))  # 4 blocks: 2 free frames + 2 victims
    assert alloc.moves == [Move(1, (D, 2), None), Move(2, (D, 3), None)]
    assert pool.block_ids(5) == [1, 2, 3, 4] and pool.block_table(5) == [2, 3, 4, 5]
    assert info(pool, 0).frame == 1 and pool.num_evictable(D) == 1


def test_a_cached_prefix_loses_its_tail_before_its_head():
    """Blocks freed together tie on recency: the deepest goes first, so the prefix that is
    left can still be hit (a tail without its head never can)."""
    pool, clock = make_pool(device=5)  # 4 usable frames
    prompt = list(range(13))  # 3 full blocks cached: ids 0, 1, 2 at depths 0, 1, 2
    cached_prompt(pool, 1, prompt)
    clock.now = 1.0
    alloc = pool.allocate(2, [50, 51, 52, 53, 54, 55])  # 2 blocks: 1 free frame + 1 victim
    assert alloc.moves == [Move(2, (D, 3), None)]
    pool.free(2)
    assert pool.allocate(3, prompt).num_cached_tokens == 8  # blocks 0 and 1 still hit


@pytest.mark.parametrize(("make_policy", "victim"), [(LRUPolicy, Move(0, (D, 1), None)), (A2CRPolicy, Move(1, (D, 2), None))])
def test_a2cr_keeps_a_frequently_hit_block_that_lru_drops(make_policy: type[EvictionPolicy], victim: Move):
    pool, clock = make_pool(device=4, policy=make_policy())  # 3 usable frames
    one_block_prompts(pool, clock, [1])
    for t in (2.0, 3.0, 4.0):  # block 0 hit three times
        clock.now = t
        cached_prompt(pool, 10, [1, 1, 1, 1, 1])
    one_block_prompts(pool, clock, [5, 6])  # blocks 1, 2: each used once, more recently
    clock.now = 7.0
    assert pool.allocate(3, [7]).moves == [victim]


def test_victims_cascade_to_host_then_nvme_then_are_dropped():
    pool, clock = make_pool(device=3, host=1, nvme=1)  # 2 DEVICE frames
    one_block_prompts(pool, clock, [1, 2])  # block 0 at D1, block 1 at D2
    clock.now = 3.0
    assert cached_prompt(pool, 3, [3] * BS) == [Move(0, (D, 1), (H, 0))]
    assert [(b.block_id, b.tier, b.frame) for b in pool.blocks()] == [(0, H, 0), (1, D, 2), (2, D, 1)]
    clock.now = 4.0
    moves = cached_prompt(pool, 4, [4] * BS)
    assert moves == [Move(0, (H, 0), (N, 0)), Move(1, (D, 2), (H, 0))]
    clock.now = 5.0
    moves = cached_prompt(pool, 5, [5] * BS)
    assert moves == [Move(0, (N, 0), None), Move(1, (H, 0), (N, 0)), Move(2, (D, 1), (H, 0))]
    assert [(b.block_id, b.tier, b.frame) for b in pool.blocks()] == [(0, D, 1), (1, N, 0), (2, H, 0), (3, D, 2)]


def test_a_hit_in_nvme_is_promoted_after_room_is_made():
    pool, clock = make_pool(device=3, host=1, nvme=1)
    one_block_prompts(pool, clock, [1, 2, 3, 4, 5])  # as above: 0 at D1, 1 at N0, 2 at H0, 3 at D2
    clock.now = 6.0
    alloc = pool.allocate(6, [2, 2, 2, 2, 9])  # hit on block 1, in NVME
    assert alloc.num_cached_tokens == 4
    # DEVICE is full, so block 1 goes up through the sink and its NVME frame takes part in the
    # cascade: D victim 3 (LRU, t=4) -> HOST, whose block 2 -> the NVME frame 1 left. Then the
    # fresh block's room: D victim 0 -> HOST, 3 -> NVME, and 2, the oldest, is dropped.
    assert alloc.moves == [
        Move(1, (N, 0), (D, 0)),
        Move(2, (H, 0), (N, 0)),
        Move(3, (D, 2), (H, 0)),
        Move(1, (D, 0), (D, 2)),
        Move(2, (N, 0), None),
        Move(3, (H, 0), (N, 0)),
        Move(0, (D, 1), (H, 0)),
    ]
    assert pool.block_ids(6) == [1, 2] and pool.block_table(6) == [2, 1]
    assert info(pool, 0).tier is H and info(pool, 3).tier is N  # both victims kept, one tier down


def test_an_absent_host_tier_is_skipped():
    pool, clock = make_pool(device=2, host=0, nvme=1)
    one_block_prompts(pool, clock, [1])
    clock.now = 2.0
    assert cached_prompt(pool, 2, [2] * BS) == [Move(0, (D, 1), (N, 0))]


# -- swapping --------------------------------------------------------------------------------
# -- sliding-window release -----------------------------------------------------------------
def test_release_retires_private_blocks_and_keeps_cached_ones_for_hits():
    pool, _ = make_pool(device=10)
    tokens = list(range(14))
    pool.allocate(1, tokens)  # blocks 0..3 in frames 1..4
    pool.commit(1, tokens, 8)  # blocks 0 and 1 full and cached; 2 and 3 not yet
    pool.release(1, 1)
    assert pool.first_block(1) == 1 and pool.block_ids(1) == [1, 2, 3] and pool.block_table(1) == [2, 3, 4]
    assert pool.num_evictable(D) == 1 and pool.usage(D) == 4  # block 0: cached, unreferenced
    pool.commit(1, tokens, 12)  # block 2 fills: still hashed after the chain's head was released
    pool.release(1, 3)
    assert pool.block_ids(1) == [3] and pool.num_evictable(D) == 3
    assert pool.append(1, 17) == [] and pool.block_ids(1) == [3, 4]  # logical blocks 3 and 4
    pool.free(1)
    assert pool.allocate(2, tokens[:13]).num_cached_tokens == 12  # all three released blocks hit


def test_allocate_with_hits_from_a_first_block_skips_the_blocks_before_it():
    pool, _ = make_pool(device=10)
    tokens = list(range(17))
    cached_prompt(pool, 1, tokens)  # blocks 0..3 cached
    hashes = pool.prefix_hashes(tokens)
    assert len(hashes) == 4 and pool.num_leading_hits(hashes) == 4 and pool.is_cached(hashes[2])
    pool.invalidate(0)  # the head is gone: a pool coordinating a window may still use 1..3
    assert pool.num_leading_hits(hashes) == 0
    assert pool.can_allocate_prefix(tokens, 4, first_block=1)
    alloc = pool.allocate(2, tokens, num_hits=4, first_block=1)
    assert alloc == Allocation(num_cached_tokens=16, moves=[])
    assert pool.first_block(2) == 1 and pool.block_ids(2)[:3] == [1, 2, 3] and len(pool.block_ids(2)) == 4
    with pytest.raises(ValueError, match="outside"):
        pool.allocate(3, tokens, num_hits=5)


def test_swap_out_and_in_restores_the_same_blocks_on_device():
    pool, _ = make_pool(device=6, host=2, nvme=2)
    tokens = list(range(12))
    pool.allocate(1, tokens)
    pool.commit(1, tokens, 12)
    pool.allocate(2, [*tokens[:4], 90, 91])  # shares block 0
    assert pool.block_ids(2) == [0, 3]
    assert pool.swap_out(1) == [Move(1, (D, 2), (H, 0)), Move(2, (D, 3), (H, 1))]
    assert pool.is_swapped(1) and info(pool, 0).tier is D  # the shared block stays
    with pytest.raises(ValueError, match="swap_in first"):
        pool.block_table(1)
    pool.allocate(3, [5] * 8)  # takes D2 and D3
    assert pool.block_table(3) == [2, 3]
    before = state(pool)
    assert pool.swap_in(1) is None and state(pool) == before
    pool.free(3)
    assert pool.swap_in(1) == [Move(1, (H, 0), (D, 2)), Move(2, (H, 1), (D, 3))]
    assert pool.block_ids(1) == [0, 1, 2] and pool.block_table(1) == [1, 2, 3]
    assert not pool.is_swapped(1) and pool.usage(H) == 0


def test_swap_out_spills_to_nvme_when_host_is_full():
    pool, _ = make_pool(device=6, host=1, nvme=2)
    pool.allocate(1, list(range(12)))
    assert pool.swap_out(1) == [Move(1, (D, 2), (N, 0)), Move(2, (D, 3), (N, 1)), Move(0, (D, 1), (H, 0))]
    assert pool.swap_in(1) == [Move(0, (H, 0), (D, 1)), Move(1, (N, 0), (D, 2)), Move(2, (N, 1), (D, 3))]


def test_swap_out_evicts_cached_blocks_down_the_tiers():
    pool, clock = make_pool(device=4, host=1, nvme=1)
    one_block_prompts(pool, clock, [1, 2, 3, 4])  # the 4th demotes block 0 to H0
    clock.now = 5.0
    # Sequence 5's block 4 takes D2: block 1 goes to H0, pushing block 0 to N0.
    assert pool.allocate(5, [9, 9]).moves == [Move(0, (H, 0), (N, 0)), Move(1, (D, 2), (H, 0))]
    # Swapped-out blocks outrank cached ones: block 1 moves on to NVME, block 0 is dropped.
    assert pool.swap_out(5) == [Move(0, (N, 0), None), Move(1, (H, 0), (N, 0)), Move(4, (D, 2), (H, 0))]


def test_swap_out_fails_cleanly_without_room_below():
    pool, _ = make_pool(device=6, host=1, nvme=0)
    pool.allocate(1, list(range(8)))
    before = state(pool)
    assert pool.swap_out(1) is None
    assert state(pool) == before and not pool.is_swapped(1)


# -- full pool -------------------------------------------------------------------------------
def test_allocate_and_append_return_none_and_change_nothing_when_full():
    pool, _ = make_pool(device=4)  # 3 usable frames
    pool.allocate(1, list(range(8)))
    assert pool.num_free(D) + pool.num_evictable(D) == 1  # room for one more block
    before = state(pool)
    assert pool.allocate(2, list(range(9))) is None
    assert pool.append(1, 13) is None
    assert state(pool) == before and pool.block_ids(1) == [0, 1]
    with pytest.raises(KeyError):
        pool.block_ids(2)
    assert pool.append(1, 12) == [] and pool.block_ids(1) == [0, 1, 2]


def test_allocate_counts_reused_blocks_as_no_longer_evictable():
    pool, _ = make_pool(device=4)
    cached_prompt(pool, 1, list(range(8)))  # blocks 0 and 1 cached; 1 frame free
    before = state(pool)
    # Reusing block 0 leaves 1 free + 1 evictable frame, but 3 new blocks are needed.
    assert pool.allocate(2, list(range(4)) + [9] * 9) is None
    assert state(pool) == before


# -- invalidation ----------------------------------------------------------------------------
def test_invalidate_an_unreferenced_block_frees_it_at_once():
    pool, _ = make_pool()
    cached_prompt(pool, 1, list(range(9)))
    pool.invalidate(1)
    assert [b.block_id for b in pool.blocks()] == [0] and pool.num_free(D) == 8
    assert pool.allocate(2, list(range(9))).num_cached_tokens == 4
    pool.invalidate(42)  # not live: nothing to do


def test_invalidate_a_held_block_keeps_it_until_its_holders_let_go():
    pool, _ = make_pool()
    cached_prompt(pool, 1, list(range(9)))
    pool.allocate(2, list(range(9)))
    pool.invalidate(0)
    assert info(pool, 0).ref_count == 1 and not pool.blocks()[0].is_cached
    assert pool.allocate(3, list(range(9))).num_cached_tokens == 0  # block 1 is cached, but after a miss
    assert pool.block_ids(3) == [3, 4, 5]
    pool.free(2)
    assert [(b.block_id, b.ref_count) for b in pool.blocks()] == [(1, 0), (3, 1), (4, 1), (5, 1)]
    pool.commit(3, list(range(9)), 9)  # block 3 caches the first block again, so block 1 is reachable
    assert pool.allocate(4, list(range(9))).num_cached_tokens == 8
    assert pool.block_ids(4) == [3, 1, 0]


# -- argument errors -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [((1, 0, 0, 4), "num_device_blocks"), ((4, -1, 0, 4), "host and NVMe"), ((4, 0, 0, 0), "block_size")],
)
def test_pool_sizes_are_validated(args: tuple[int, int, int, int], message: str):
    with pytest.raises(ValueError, match=message):
        BlockPool(*args, LRUPolicy())


def test_misuse_is_reported():
    pool, _ = make_pool(device=6, host=4)
    pool.allocate(1, [1, 2])
    with pytest.raises(ValueError, match="already has blocks"):
        pool.allocate(1, [1])
    with pytest.raises(ValueError, match="at least one token"):
        pool.allocate(2, [])
    with pytest.raises(ValueError, match="not swapped out"):
        pool.swap_in(1)
    with pytest.raises(ValueError, match="more than its 1 blocks"):
        pool.commit(1, list(range(8)), 8)
    pool.swap_out(1)
    with pytest.raises(ValueError, match="swap_in first"):
        pool.append(1, 5)
    with pytest.raises(KeyError, match="unknown sequence 9"):
        pool.free(9)


# -- random walk -----------------------------------------------------------------------------
def replay(before: list[BlockInfo], moves: list[Move], pool: BlockPool) -> None:
    """Execute a plan on the frames as they were: each move finds its block at src and an empty
    dst, only unreferenced blocks are dropped, and the blocks end where the pool says they are."""
    at = {(b.tier, b.frame): b.block_id for b in before}
    ref_count = {b.block_id: b.ref_count for b in before}
    for move in moves:
        assert at.pop(move.src) == move.block_id
        if move.dst is None:
            assert ref_count[move.block_id] == 0
        else:
            assert move.dst not in at
            at[move.dst] = move.block_id
    now_at = {b.block_id: (b.tier, b.frame) for b in pool.blocks()}
    for place, block_id in at.items():
        assert now_at[block_id] == place


class PoolMachine(RuleBasedStateMachine):
    """Random sequences over a tiny pool, against a model of what each block's KV holds."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.pool: BlockPool | None = None
        self.tokens: dict[int, list[int]] = {}  # sequence -> its tokens so far
        self.num_computed: dict[int, int] = {}
        self.swapped: set[int] = set()
        self.content: dict[int, tuple[int, ...]] = {}  # block -> all tokens up to its end, once written
        self.invalidated: set[int] = set()  # blocks dropped from the cache as corrupt
        self.prompts: list[tuple[int, ...]] = []  # tokens of the ended sequences, to share prefixes with
        self.next_seq_id = 0

    @initialize(
        device=st.integers(2, 10),
        host=st.integers(0, 4),
        nvme=st.integers(0, 4),
        cache=st.sampled_from([True, True, False]),
        lru=st.booleans(),
        warm=st.lists(TOKENS, max_size=6),
        offload=st.booleans(),
    )
    def build(self, device: int, host: int, nvme: int, cache: bool, lru: bool, warm: list[list[int]], offload: bool) -> None:
        """A pool, warmed by prompts that ran to the end (their full blocks cached); with `offload`,
        running sequences may keep blocks on HOST."""
        policy = LRUPolicy() if lru else A2CRPolicy()
        self.pool = BlockPool(device, host, nvme, BS, policy, cache, clock=self.clock, offload=offload)
        for prompt in warm:
            seq_id = self._add(prompt)
            if seq_id is not None:
                self._commit(seq_id, len(prompt))
                self._free(seq_id)

    # -- rules
    @rule(data=st.data(), suffix=TOKENS, prefill=st.booleans())
    def add(self, data: st.DataObject, suffix: list[int], prefill: bool) -> None:
        """A new prompt: some leading tokens of an ended sequence (maybe none), then `suffix`;
        with `prefill`, its first step runs at once (all its tokens computed)."""
        self._add_after(data, self.prompts, suffix, prefill)

    @rule(data=st.data(), suffix=TOKENS, prefill=st.booleans())
    def add_sibling(self, data: st.DataObject, suffix: list[int], prefill: bool) -> None:
        """The same, sharing leading tokens with a live sequence."""
        self._add_after(data, [tuple(t) for _, t in sorted(self.tokens.items())], suffix, prefill)

    @rule(data=st.data(), extra=st.lists(st.integers(0, 1), min_size=1, max_size=6))
    def append(self, data: st.DataObject, extra: list[int]) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        num_blocks = len(self.pool.block_ids(seq_id))
        if self._planned(lambda: self.pool.append(seq_id, len(self.tokens[seq_id]) + len(extra))) is not None:
            self._new_blocks(self.pool.block_ids(seq_id)[num_blocks:])
            self.tokens[seq_id] += extra

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        num_tokens = len(self.tokens[seq_id])
        self._commit(seq_id, data.draw(st.one_of(st.just(num_tokens), st.integers(self.num_computed[seq_id], num_tokens))))

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Computed leading blocks of a running sequence leave its sliding window."""
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        first = data.draw(st.integers(0, self.num_computed[seq_id] // BS))
        kept = self.pool.block_ids(seq_id)[max(0, first - self.pool.first_block(seq_id)) :]
        self.pool.release(seq_id, first)
        assert self.pool.block_ids(seq_id) == kept
        assert self.pool.first_block(seq_id) >= first

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A sequence ends with all its tokens computed."""
        seq_id = self._pick(data, self._running())
        if seq_id is not None:
            self._commit(seq_id, len(self.tokens[seq_id]))
            self._free(seq_id)

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """A sequence is aborted or preempted by recompute, running or swapped out."""
        seq_id = self._pick(data, sorted(self.tokens))
        if seq_id is not None:
            self._free(seq_id)

    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None or self._planned(lambda: self.pool.swap_out(seq_id)) is None:
            return
        live = {b.block_id: b for b in self.pool.blocks()}
        for block_id in self.pool.block_ids(seq_id):  # only shared blocks stay on DEVICE
            assert live[block_id].tier is not D or live[block_id].ref_count > 1
            assert self.pool.offload or (live[block_id].tier is D) == (live[block_id].ref_count > 1)
        self.swapped.add(seq_id)

    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, sorted(self.swapped))
        if seq_id is None:
            return
        block_ids = self.pool.block_ids(seq_id)
        if self._planned(lambda: self.pool.swap_in(seq_id)) is not None:
            assert self.pool.block_ids(seq_id) == block_ids
            self.swapped.discard(seq_id)

    @rule(data=st.data())
    def invalidate(self, data: st.DataObject) -> None:
        """A block's bytes are found corrupt (its holders go on here: the checks still hold)."""
        blocks = self.pool.blocks()
        if not blocks:
            return
        block = data.draw(st.sampled_from(blocks))
        self.pool.invalidate(block.block_id)
        if block.is_cached:
            self.invalidated.add(block.block_id)
        live = {b.block_id: b for b in self.pool.blocks()}
        if block.ref_count:  # held: stays until its holders let go, but out of the cache
            assert not live[block.block_id].is_cached
        else:
            assert block.block_id not in live

    @rule(seconds=st.floats(0.0, 30.0), mass=st.floats(0.0, 4.0), data=st.data())
    def tick(self, seconds: float, mass: float, data: st.DataObject) -> None:
        """Time passes; a live block may receive attention."""
        self.clock.now += seconds
        blocks = self.pool.blocks()
        if blocks:
            self.pool.policy.add_attention(data.draw(st.sampled_from(blocks)).block_id, mass)

    # -- invariants
    @invariant()
    def consistent(self) -> None:
        if self.pool is None:
            return
        pool, blocks = self.pool, self.pool.blocks()
        places = [(b.tier, b.frame) for b in blocks]
        assert len(set(places)) == len(places)  # no frame holds two blocks
        assert (D, BlockPool.SINK_SLOT) not in places
        for tier in Tier:
            in_tier = [b for b in blocks if b.tier is tier]
            first = 1 if tier is D else 0
            assert all(first <= b.frame < first + pool.num_frames(tier) for b in in_tier)
            assert pool.usage(tier) == len(in_tier)
            assert pool.num_free(tier) + pool.usage(tier) == pool.num_frames(tier)
            assert pool.num_evictable(tier) == sum(b.ref_count == 0 for b in in_tier)
        holders = Counter(b for s in self.tokens for b in pool.block_ids(s))
        frames = {b.block_id: b.frame for b in blocks}
        for b in blocks:
            assert b.ref_count == holders[b.block_id]
            assert b.ref_count > 0 or b.is_cached  # an unreferenced block is either cached or gone
            assert pool.enable_prefix_cache or not b.is_cached
        assert set(holders) <= {b.block_id for b in blocks}
        for seq_id, tokens in self.tokens.items():
            block_ids = pool.block_ids(seq_id)
            assert len(set(block_ids)) == len(block_ids)
            assert pool.first_block(seq_id) + len(block_ids) == -(-len(tokens) // BS)
            assert pool.is_swapped(seq_id) == (seq_id in self.swapped)
            if seq_id not in self.swapped:
                places = dict(zip((b.block_id for b in blocks), ((b.tier, b.frame) for b in blocks)))
                assert pool.block_locations(seq_id) == [places[b] for b in block_ids]
                assert all(places[b][0] is not N for b in block_ids)  # a running sequence reads D or H only
                assert pool.is_offloaded(seq_id) == any(places[b][0] is not D for b in block_ids)
                assert pool.offload or not pool.is_offloaded(seq_id)
                if not pool.is_offloaded(seq_id):
                    assert pool.block_table(seq_id) == [frames[b] for b in block_ids]

    def teardown(self) -> None:
        if self.pool is None:
            return
        for seq_id in list(self.tokens):
            self._free(seq_id)
        blocks = self.pool.blocks()
        assert all(b.ref_count == 0 and b.is_cached for b in blocks)
        for tier in Tier:
            num_cached = sum(b.tier is tier for b in blocks)
            assert self.pool.usage(tier) == num_cached == self.pool.num_evictable(tier)
            assert self.pool.enable_prefix_cache or self.pool.usage(tier) == 0

    # -- the steps the rules share, each checked against the model
    def _add_after(self, data: st.DataObject, bases: list[tuple[int, ...]], suffix: list[int], prefill: bool) -> None:
        base = data.draw(st.sampled_from(bases)) if bases else ()
        num_shared = data.draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
        prompt = list(base[:num_shared]) + suffix
        seq_id = self._add(prompt)
        if prefill and seq_id is not None:
            self._commit(seq_id, len(prompt))

    def _add(self, prompt: list[int]) -> int | None:
        seq_id, self.next_seq_id = self.next_seq_id, self.next_seq_id + 1
        alloc = self._planned(lambda: self.pool.allocate(seq_id, prompt))
        if alloc is None:
            return None
        num_hits, rest = divmod(alloc.num_cached_tokens, BS)
        assert rest == 0 and alloc.num_cached_tokens <= len(prompt) - 1
        assert self.pool.enable_prefix_cache or num_hits == 0
        block_ids = self.pool.block_ids(seq_id)
        for i, block_id in enumerate(block_ids[:num_hits]):  # a hit holds exactly this prefix's KV
            assert self.content[block_id] == tuple(prompt[: (i + 1) * BS])
            assert block_id not in self.invalidated
        self._new_blocks(block_ids[num_hits:])
        self.tokens[seq_id] = list(prompt)
        self.num_computed[seq_id] = alloc.num_cached_tokens
        return seq_id

    def _commit(self, seq_id: int, num_computed: int) -> None:
        tokens = self.tokens[seq_id]
        self.pool.commit(seq_id, tokens, num_computed)
        self.num_computed[seq_id] = num_computed
        first = self.pool.first_block(seq_id)
        for i, block_id in enumerate(self.pool.block_ids(seq_id)[: max(0, num_computed // BS - first)], first):
            prefix = tuple(tokens[: (i + 1) * BS])
            assert self.content.setdefault(block_id, prefix) == prefix

    def _free(self, seq_id: int) -> None:
        self.pool.free(seq_id)
        self.prompts.append(tuple(self.tokens.pop(seq_id)))
        del self.num_computed[seq_id]
        self.swapped.discard(seq_id)

    def _running(self) -> list[int]:
        return sorted(s for s in self.tokens if s not in self.swapped)

    @staticmethod
    def _pick(data: st.DataObject, seq_ids: list[int]) -> int | None:
        """One of `seq_ids`, or None when there is none (the rule then does nothing)."""
        return data.draw(st.sampled_from(seq_ids)) if seq_ids else None

    def _new_blocks(self, block_ids: list[int]) -> None:
        """Fresh blocks (maybe recycled ids) hold nothing yet."""
        for block_id in block_ids:
            self.content.pop(block_id, None)
            self.invalidated.discard(block_id)

    def _planned(self, call: Callable[[], Plan | None]) -> Plan | None:
        """Run a pool call that plans moves: None must change nothing; a plan must replay cleanly."""
        before = self.pool.blocks(), {s: self.pool.block_ids(s) for s in self.tokens}
        plan = call()
        if plan is None:
            assert (self.pool.blocks(), {s: self.pool.block_ids(s) for s in self.tokens}) == before
        else:
            replay(before[0], plan.moves if isinstance(plan, Allocation) else plan, self.pool)
        return plan


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=200, deadline=None)
TestPoolMachine.pytestmark = [pytest.mark.slow]  # 14 s on the 2-core VM, loaded
