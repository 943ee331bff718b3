"""BlockGroups: a full-attention and a sliding-window block group driven together (block_size 4,
window 8: a query at position p sees positions p - 7 .. p, i.e. logical blocks from (p - 7) // 4)."""

from __future__ import annotations

import pytest

from wicore.blocks.block_groups import FULL, WINDOW, BlockGroups
from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import LRUPolicy
from wicore.blocks.tier import Tier

BS, WINDOW_TOKENS = 4, 8


def make_cache(full: int = 32, window: int = 8, window_host: int = 0) -> BlockGroups:
    return BlockGroups(
        BlockPool(full, 0, 0, BS, LRUPolicy(), group=FULL),
        BlockPool(window, window_host, 0, BS, LRUPolicy(), group=WINDOW),
        WINDOW_TOKENS,
    )


def run(cache: BlockGroups, seq_id: int, tokens: list[int], chunk: int) -> None:
    """Prefill `tokens` chunk by chunk as the scheduler does, committing after each step."""
    alloc = cache.allocate(seq_id, tokens, chunk)
    assert alloc is not None
    done = alloc.num_cached_tokens
    while done < len(tokens):
        n = min(chunk, len(tokens) - done)
        assert cache.append(seq_id, done, done + n) is not None
        table, first = cache.window_table(seq_id)
        assert first == max(0, (done - WINDOW_TOKENS + 1) // BS)  # the oldest block a query still sees
        assert first + len(table) == -(-(done + n) // BS)
        done += n
        cache.commit(seq_id, tokens, done)


def test_the_window_group_holds_the_window_while_the_full_group_holds_everything():
    cache = make_cache()
    tokens = list(range(100, 160))  # 60 tokens = 15 blocks
    run(cache, 1, tokens, chunk=4)
    assert len(cache.block_table(1)) == 15
    table, first = cache.window_table(1)
    assert (first, len(table)) == (12, 3)  # the last step (positions 56..59) sees positions 49.., blocks 12..14
    # Released blocks were full and committed: they stay cached (evictable) in the window group.
    window = cache.window.pool
    assert window.usage(Tier.DEVICE) == 7 and window.num_evictable(Tier.DEVICE) == 4  # 7 usable frames
    # Every block the sequence holds, in either group, names it as a holder; the released
    # window blocks (cached, nobody's) name no one.
    held = {(FULL, b) for b in cache.block_ids(1)} | {(WINDOW, b) for b in window.block_ids(1)}
    assert len(held) == 15 + 3
    assert all(cache.holders({key}) == {1} for key in held)
    released = {(WINDOW, b.block_id) for b in window.blocks() if b.block_id not in window.block_ids(1)}
    assert len(released) == 4
    assert cache.holders(released) == set()


def test_a_prefix_hit_needs_the_window_blocks_before_the_first_token_to_compute():
    cache = make_cache(window=9)  # 8 usable window blocks
    prompt = list(range(40))  # 10 blocks
    run(cache, 1, prompt, chunk=8)
    cache.free(1)
    # All 9 full blocks before the last hit in the full group; the window group kept the
    # blocks the 37th token (position 36) sees, 7 and 8: so all 9 are reused.
    alloc = cache.allocate(2, [*prompt[:37], 999], 8)
    assert alloc.num_cached_tokens == 36
    assert cache.window_table(2)[1] == 7
    cache.free(2)
    # Another prompt needs all 8 window blocks: the cached ones are evicted, deepest first.
    run(cache, 3, list(range(500, 532)), chunk=16)
    cache.free(3)
    # The full group still has the first prompt's blocks, the window group does not: no hit
    # for which the window blocks exist, so everything is computed again.
    assert cache.full.pool.num_leading_hits(cache.full.pool.prefix_hashes(prompt)) == 9
    assert cache.allocate(4, prompt, 8).num_cached_tokens == 0


def test_a_group_without_room_changes_nothing_in_the_other():
    cache = make_cache(full=32, window=3)  # 2 usable window blocks: one 8-token chunk at most
    before = cache.full.pool.blocks(), cache.window.pool.blocks()
    assert cache.allocate(1, list(range(20)), 12) is None  # the window group needs 3 blocks
    assert (cache.full.pool.blocks(), cache.window.pool.blocks()) == before
    alloc = cache.allocate(1, list(range(20)), 8)
    assert alloc is not None and len(cache.block_table(1)) == 5 and len(cache.window_table(1)[0]) == 2
    assert cache.append(1, 8, 20) is None  # 12 more tokens need 3 window blocks at once
    assert len(cache.window.pool.block_ids(1)) == 2 and len(cache.block_table(1)) == 5


def test_swap_out_and_in_covers_both_groups():
    cache = BlockGroups(
        BlockPool(16, 16, 0, BS, LRUPolicy(), group=FULL), BlockPool(8, 8, 0, BS, LRUPolicy(), group=WINDOW), WINDOW_TOKENS
    )
    run(cache, 1, list(range(30)), chunk=6)
    moves = cache.swap_out(1)
    assert {m.group for m in moves} == {FULL, WINDOW}
    assert all(m.dst[0] is Tier.HOST for m in moves)
    assert len([m for m in moves if m.group == WINDOW]) == len(cache.window.pool.block_ids(1))
    back = cache.swap_in(1)
    assert sorted((m.group, m.block_id) for m in back) == sorted((m.group, m.block_id) for m in moves)


def test_the_groups_must_agree():
    with pytest.raises(ValueError, match="block size"):
        BlockGroups(BlockPool(4, 0, 0, 4, LRUPolicy()), BlockPool(4, 0, 0, 8, LRUPolicy()), 8)
    with pytest.raises(ValueError, match="window size"):
        BlockGroups(BlockPool(4, 0, 0, 4, LRUPolicy()), BlockPool(4, 0, 0, 4, LRUPolicy()))


def test_holders_name_every_sequence_sharing_a_block():
    cache = make_cache(full=32, window=16)
    prefix = list(range(100, 108))  # two full blocks
    run(cache, 1, [*prefix, 1, 2, 3], chunk=16)
    run(cache, 2, [*prefix, 4, 5, 6, 7, 8], chunk=16)
    shared, own = cache.block_ids(2)[:2], cache.block_ids(2)[2:]
    assert cache.block_ids(1)[:2] == shared and not set(cache.block_ids(1)[2:]) & set(own)
    assert cache.holders({(FULL, shared[0])}) == {1, 2}
    assert cache.holders({(FULL, own[0])}) == {2}
    assert cache.holders({(FULL, cache.block_ids(1)[2]), (FULL, own[1])}) == {1, 2}
    # A block id is only meaningful within its group.
    window_ids = set(cache.window.pool.block_ids(1)) | set(cache.window.pool.block_ids(2))
    stranger = next(i for i in range(100) if i not in window_ids)
    assert cache.holders({(WINDOW, stranger)}) == set()
    cache.free(1)
    assert cache.holders({(FULL, shared[0])}) == {2}


def test_holds_says_when_append_would_change_nothing():
    """`holds` is True exactly where `append` adds no block and releases none: a decode row within its
    last block whose window keeps its first block (the scheduler then keeps the last row's tables)."""
    cache = make_cache()
    tokens = list(range(100, 110))  # 10 tokens: blocks 0..2, the last one half full
    run(cache, 1, tokens, chunk=10)
    assert (cache.window_table(1)[1], len(cache.block_ids(1))) == (0, 3)
    # position 10: still block 2, and its queries see positions 3.., from block 0
    assert cache.holds(1, 10, 11) and cache.append(1, 10, 11) == []
    assert not cache.holds(1, 11, 12)  # position 11 sees positions 4..: block 0 of the window goes
    before = cache.window_table(1)
    assert cache.append(1, 11, 12) == []  # released, no move
    assert before == (before[0], 0) and cache.window_table(1) == (before[0][1:], 1)
    assert cache.holds(1, 11, 12)  # done: asking again changes nothing
    assert not cache.holds(1, 12, 13)  # position 12 starts block 3
    assert cache.append(1, 12, 13) == [] and len(cache.block_ids(1)) == 4
    assert cache.holds(1, 12, 13) and cache.holds(1, 14, 15)
    assert not cache.holds(1, 15, 16)  # sees positions 8..: block 1 goes
    assert not cache.holds(1, 14, 17)  # a step of 3 tokens from position 14 ends in block 4
