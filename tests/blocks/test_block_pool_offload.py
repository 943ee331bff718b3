"""An offloading BlockPool (the full-attention group when the engine stages KV per step): running
sequences keep blocks on DEVICE or HOST. Tiny pools (block_size 4), exact ids, frames and plans."""

from __future__ import annotations

import pytest

from wicore.blocks.block_pool import BlockPool, Move
from wicore.blocks.policy import A2CRPolicy, EvictionPolicy, LRUPolicy
from wicore.blocks.tier import Tier

BS = 4
D, H, N = Tier.DEVICE, Tier.HOST, Tier.NVME


def make_pool(device: int, host: int, nvme: int = 0, offload: bool = True, policy: EvictionPolicy | None = None) -> BlockPool:
    return BlockPool(device, host, nvme, BS, policy or LRUPolicy(), clock=lambda: 0.0, offload=offload)


def test_a_prompt_longer_than_the_device_tier_keeps_its_first_blocks_on_host_and_its_tail_on_device():
    """17 tokens are 5 blocks; DEVICE has 3 frames (and the sink): the first 2 blocks go to HOST.
    A pool that does not offload cannot take the prompt at all."""
    pool = make_pool(device=4, host=4)
    alloc = pool.allocate(0, list(range(17)))
    assert alloc is not None and alloc.moves == []
    assert pool.block_ids(0) == [0, 1, 2, 3, 4]
    assert pool.block_locations(0) == [(H, 0), (H, 1), (D, 1), (D, 2), (D, 3)]
    assert pool.is_offloaded(0)
    with pytest.raises(ValueError, match="is in HOST"):
        pool.block_table(0)
    assert make_pool(device=4, host=4, offload=False).allocate(0, list(range(17))) is None
    assert not pool.can_allocate_prefix(list(range(100, 117)), 0)  # 5 more blocks: 0 DEVICE + 2 HOST frames left


def test_a_growing_sequence_spills_the_policys_worst_of_its_own_device_blocks_never_its_tail():
    """DEVICE is full of the sequence's own blocks 0, 1, 2; one more block is needed. LRU spills
    block 0 (all were used at once: the first in order); A2CR, with attention on block 0, spills
    block 1. The new tail takes the freed DEVICE frame."""
    lru = make_pool(device=4, host=4)
    assert lru.allocate(0, list(range(12))) is not None
    assert lru.append(0, 13) == [Move(0, (D, 1), (H, 0))]
    assert lru.block_locations(0) == [(H, 0), (D, 2), (D, 3), (D, 1)]

    a2cr = make_pool(device=4, host=4, policy=A2CRPolicy())
    assert a2cr.allocate(0, list(range(12))) is not None
    a2cr.add_attention(0, 5.0, 0.0)
    assert a2cr.append(0, 13) == [Move(1, (D, 2), (H, 0))]
    assert a2cr.block_locations(0) == [(D, 1), (H, 0), (D, 3), (D, 2)]
    assert not a2cr.can_append(0, 4 * 8)  # 4 more blocks: 3 HOST frames left, and DEVICE holds only referenced ones


def test_a_prefix_hit_on_host_is_read_where_it_lies():
    """A second prompt reuses the first's two cached blocks, one on HOST and one on DEVICE: no
    move brings the HOST one up (the step stages it), the new block takes the free DEVICE frame."""
    pool = make_pool(device=3, host=4)
    prompt = list(range(9))
    assert pool.allocate(0, prompt) is not None
    assert pool.block_locations(0) == [(H, 0), (D, 1), (D, 2)]
    pool.commit(0, prompt, 9)
    pool.free(0)
    alloc = pool.allocate(1, prompt[:8] + [99])
    assert alloc is not None and (alloc.num_cached_tokens, alloc.moves) == (8, [])
    assert pool.block_ids(1) == [0, 1, 2] and pool.block_locations(1) == [(H, 0), (D, 1), (D, 2)]


def test_swap_out_moves_only_device_blocks_and_swap_in_lifts_nvme_and_fills_free_device_frames():
    pool = make_pool(device=3, host=1, nvme=2)
    assert pool.allocate(0, list(range(8))) is not None
    assert pool.block_locations(0) == [(D, 1), (D, 2)]
    assert pool.swap_out(0) == [Move(1, (D, 2), (N, 0)), Move(0, (D, 1), (H, 0))]
    assert not pool.is_offloaded(0)  # swapped: not running
    assert pool.swap_in(0) == [Move(1, (N, 0), (D, 1)), Move(0, (H, 0), (D, 2))]  # HOST full: NVME goes to DEVICE
    assert pool.block_locations(0) == [(D, 2), (D, 1)] and not pool.is_offloaded(0)

    offloaded = make_pool(device=3, host=4, nvme=2)
    assert offloaded.allocate(0, list(range(17))) is not None
    assert offloaded.block_locations(0) == [(H, 0), (H, 1), (H, 2), (D, 1), (D, 2)]
    assert offloaded.swap_out(0) == [Move(4, (D, 2), (N, 0)), Move(3, (D, 1), (H, 3))]  # HOST blocks stay
    assert offloaded.block_locations(0) == [(H, 0), (H, 1), (H, 2), (H, 3), (N, 0)]
    # back in: the NVME block is lifted (HOST is full: to DEVICE), then the first HOST block takes
    # the DEVICE frame left; the others are staged from HOST
    assert offloaded.swap_in(0) == [Move(4, (N, 0), (D, 1)), Move(0, (H, 0), (D, 2))]
    assert offloaded.block_locations(0) == [(D, 2), (H, 1), (H, 2), (H, 3), (D, 1)] and offloaded.is_offloaded(0)
