"""How a tier's bytes are split between the full-attention and the sliding-window block groups."""

from __future__ import annotations

import pytest

from wicore.blocks.block_groups import FULL, WINDOW
from wicore.blocks.tier import Tier
from wicore.engine.engine import EngineConfig
from wicore.engine.kv_setup import TierBlocks, plan_tiers
from wicore.engine.scheduler import SchedulerConfig
from wicore.kv.layout import GIB, KVLayout

# Gemma 3 270M, fp32, block size 16: 3 full layers, 15 sliding, 2 * 16 * 1 * 256 * 4 bytes per layer block.
LAYOUT = KVLayout(
    full_layers=(5, 11, 17),
    window_layers=tuple(i for i in range(18) if i not in (5, 11, 17)),
    window=512,
    block_size=16,
    layer_block_bytes=32768,
)


def test_block_bytes_and_window_need():
    assert (LAYOUT.block_bytes(FULL), LAYOUT.block_bytes(WINDOW)) == (98304, 491520)
    assert LAYOUT.window_blocks_per_sequence(256) == 49  # ceil((511 + 256) / 16) + 1


def test_the_window_group_takes_what_it_can_use_and_the_full_group_the_rest():
    config = EngineConfig(model_dir="unused", kv_pool_gb=4, host_tier_gb=1, scheduler=SchedulerConfig(max_num_seqs=8))
    tiers = plan_tiers(config, LAYOUT)
    window = 8 * 49 + 1  # 8 sequences' windows and chunks, plus the sink
    assert tiers[Tier.DEVICE] == TierBlocks((4 * GIB - window * 491520) // 98304, window)
    device_share = window * 491520 / (4 * GIB - (4 * GIB - window * 491520) % 98304)
    host_window = int(GIB * device_share // 491520)
    assert tiers[Tier.HOST] == TierBlocks((GIB - host_window * 491520) // 98304, host_window)
    assert tiers[Tier.NVME] == TierBlocks(0, 0)


def test_a_small_pool_splits_evenly():
    tiers = plan_tiers(EngineConfig(model_dir="unused", kv_pool_gb=0.5), LAYOUT)
    even = int(0.5 * GIB // (98304 + 491520))
    assert tiers[Tier.DEVICE].window == even
    assert tiers[Tier.DEVICE].full == int((0.5 * GIB - even * 491520) // 98304)


@pytest.mark.parametrize("window_override", [None, 12])
def test_block_counts_given_apply_to_both_groups(window_override):
    config = EngineConfig(
        model_dir="unused", num_device_blocks=40, num_host_blocks=7, num_nvme_blocks=0, num_window_device_blocks=window_override
    )
    tiers = plan_tiers(config, LAYOUT)
    assert tiers[Tier.DEVICE] == TierBlocks(40, window_override or 40)
    assert tiers[Tier.HOST] == TierBlocks(7, 7) and tiers[Tier.NVME] == TierBlocks(0, 0)


def test_a_model_without_sliding_layers_has_one_group():
    layout = KVLayout(full_layers=(0, 1), window_layers=(), window=512, block_size=16, layer_block_bytes=1024)
    assert layout.split(10 * 2048, window_need=5) == (10, 0)


def test_one_sequence_of_the_270ms_context_and_what_max_num_seqs_costs():
    """One sequence of the whole context needs 1.13 GiB; the old advice sized 64 of them (13.44 GiB)."""
    from wicore.kv.layout import context_advice, default_pool_gb, pool_gb_flag

    assert pool_gb_flag(LAYOUT.one_sequence_bytes(32768, 256, 64)) == "1.13"
    assert pool_gb_flag(LAYOUT.one_sequence_bytes(32768, 256, 1)) == "0.22"
    assert context_advice(LAYOUT, 32768, 256, 64) == (
        "kv_pool_gb 1.13 holds one sequence of 32768 tokens beside the sliding-window blocks max_num_seqs 64 "
        "reserves (max_num_seqs 1: kv_pool_gb 0.22); 64 such sequences at once take kv_pool_gb 13.44"
    )
    assert default_pool_gb(LAYOUT, 32768, 256, 64) == 1.13  # the 1 GiB default held 29,136 tokens
    assert default_pool_gb(LAYOUT, 2048, 256, 64) == 1.0  # at least 1 GiB


@pytest.mark.parametrize("max_num_seqs", [1, 4, 64])
@pytest.mark.parametrize("tokens", [100, 8192, 32768])
def test_one_sequence_bytes_is_the_least_pool_that_holds_the_sequence(max_num_seqs, tokens):
    """plan_tiers, given that many bytes, holds the sequence's full blocks and its window blocks;
    a block's bytes fewer, it does not."""
    full = LAYOUT.sequence_blocks(tokens) + 1
    window = min(LAYOUT.sequence_blocks(tokens), LAYOUT.window_blocks_per_sequence(256)) + 1

    def holds(num_bytes: int) -> bool:
        config = EngineConfig(
            model_dir="unused", kv_pool_gb=num_bytes / GIB, scheduler=SchedulerConfig(max_num_seqs=max_num_seqs)
        )
        device = plan_tiers(config, LAYOUT)[Tier.DEVICE]
        return device.full >= full and device.window >= window

    least = LAYOUT.one_sequence_bytes(tokens, 256, max_num_seqs)
    assert holds(least)
    assert not holds(least - LAYOUT.block_bytes(FULL)) and not holds(least - LAYOUT.block_bytes(WINDOW))
