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
