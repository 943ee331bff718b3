"""BlockPool on tiny pools (block_size 4): exact block ids, frames and move plans (the random walk:
test_block_pool_walk.py)."""

from __future__ import annotations

import pytest
from pool_helpers import BS, D, FakeClock, H, N, make_pool

from wicore.blocks.block_pool import Allocation, BlockInfo, BlockPool, Move
from wicore.blocks.policy import A2CRPolicy, EvictionPolicy, LRUPolicy
from wicore.blocks.tier import Tier


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
