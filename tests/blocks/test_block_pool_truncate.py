"""BlockPool.truncate: a verification row's rejected tokens give their blocks back (speculative decoding)."""

from __future__ import annotations

from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import LRUPolicy
from wicore.blocks.tier import Tier

BS = 4


def test_truncate_frees_the_blocks_past_the_kept_tokens_and_keeps_the_committed_ones():
    pool = BlockPool(10, 0, 0, BS, LRUPolicy())
    tokens = list(range(10))
    assert pool.allocate(1, tokens) is not None  # blocks 0-2 (frames 1-3) hold tokens 0-9
    pool.commit(1, tokens, 9)  # tokens 0-8 computed: blocks 0 and 1 full and hashed
    assert pool.append(1, 9 + 8) == []  # a row of 8 tokens from position 9 (the last token and 7 drafts)
    assert pool.block_ids(1) == [0, 1, 2, 3, 4] and pool.num_free(Tier.DEVICE) == 4
    # 2 of the 7 drafts kept: tokens 0-11 computed, 12 tokens known plus the next one
    pool.commit(1, [*tokens, 10, 11], 12)
    pool.truncate(1, 13)
    assert pool.block_ids(1) == [0, 1, 2, 3]  # block 4 (tokens 16-19, rejected only) is gone
    assert pool.block_table(1) == [1, 2, 3, 4] and pool.num_free(Tier.DEVICE) == 5
    assert [b.is_cached for b in pool.blocks()] == [True, True, True, False]  # blocks 0-2 full and committed
    pool.truncate(1, 13)  # nothing more to drop
    assert pool.block_ids(1) == [0, 1, 2, 3]


def test_truncate_of_a_windowed_sequence_keeps_its_first_block():
    pool = BlockPool(10, 0, 0, BS, LRUPolicy())
    assert pool.allocate(1, list(range(6))) is not None
    assert pool.append(1, 14) == []  # 4 blocks
    pool.release(1, 2)  # blocks 0 and 1 left the window
    pool.truncate(1, 9)  # tokens 0-8: blocks 0-2, of which block 2 is live
    assert pool.first_block(1) == 2 and len(pool.block_ids(1)) == 1
    pool.truncate(1, 3)  # fewer tokens than the released blocks held: no live block left, none negative
    assert pool.block_ids(1) == []
