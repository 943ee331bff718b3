"""The engine's KV cache assembled from an EngineConfig: blocks per group and tier, then the
block pools (wicore.blocks) over the device buffers and new host / NVMe stores (wicore.kv)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wicore.blocks.block_groups import FULL, WINDOW
from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import A2CRPolicy, LRUPolicy
from wicore.blocks.tier import Tier
from wicore.devices.pinned import host_allocator
from wicore.devices.placement import GIB
from wicore.engine.config import EngineConfig
from wicore.errors import WiCoreError
from wicore.kv.buffers import KVBuffers
from wicore.kv.cache import KVCache
from wicore.kv.layout import KVLayout
from wicore.kv.pager import Pager
from wicore.kv.tiers import HostStore, NvmeStore, TierStore


@dataclass(frozen=True)
class TierBlocks:
    """Blocks of each group in one tier (the device tier counts the sink)."""

    full: int
    window: int


def plan_tiers(config: EngineConfig, layout: KVLayout, reserved_bytes: int = 0) -> dict[Tier, TierBlocks]:
    """Blocks per group and tier from an EngineConfig; `reserved_bytes` of the device pool go to
    something else (the stages of offloaded steps). Explicit block counts (num_*_blocks) apply to
    both groups alike."""
    sched = config.scheduler
    need = sched.max_num_seqs * layout.window_blocks_per_sequence(sched.prefill_chunk) + 1
    budget = config.kv_pool_gb * GIB - reserved_bytes
    if (
        reserved_bytes
        and config.num_device_blocks is None
        and budget < 2 * (layout.block_bytes(FULL) + layout.block_bytes(WINDOW))
    ):
        raise WiCoreError(
            f"kv_pool_gb {config.kv_pool_gb:g} leaves no room for KV blocks beside {reserved_bytes / GIB:.2f} GiB of KV "
            "stages: raise kv_pool_gb or lower kv_offload_tokens"
        )
    full, window = layout.split(budget, need)
    device = TierBlocks(max(2, full), max(2, window) if layout.has_window else 0)
    # The lower tiers hold what device blocks are demoted or swapped to: same byte shares.
    window_bytes = device.window * layout.block_bytes(WINDOW)
    share = window_bytes / (window_bytes + device.full * layout.block_bytes(FULL))
    tiers = {Tier.DEVICE: device}
    for tier, gb in ((Tier.HOST, config.host_tier_gb), (Tier.NVME, config.nvme_tier_gb)):
        window = int(gb * GIB * share // layout.block_bytes(WINDOW)) if layout.has_window else 0
        tiers[tier] = TierBlocks(int((gb * GIB - window * layout.block_bytes(WINDOW)) // layout.block_bytes(FULL)), window)
    overrides = {Tier.DEVICE: config.num_device_blocks, Tier.HOST: config.num_host_blocks, Tier.NVME: config.num_nvme_blocks}
    for tier, count in overrides.items():
        if count is not None:
            tiers[tier] = TierBlocks(count, count if layout.has_window else 0)
    if config.num_window_device_blocks is not None and layout.has_window:
        tiers[Tier.DEVICE] = TierBlocks(tiers[Tier.DEVICE].full, config.num_window_device_blocks)
    return tiers


def build_kv_cache(config: EngineConfig, layout: KVLayout, tiers: dict[Tier, TierBlocks], buffers: KVBuffers) -> KVCache:
    """The KV cache over `buffers` (tier 0) and new host / NVMe stores: per block group a
    BlockPool with its policy and a Pager over its stores."""
    pools: list[BlockPool] = []
    pagers: list[Pager] = []
    nvme_dir = Path(config.nvme_dir or tempfile.gettempdir())
    if tiers[Tier.NVME].full or tiers[Tier.NVME].window:
        NvmeStore.remove_stale(nvme_dir)  # files a killed process left (once, for both groups)
    for group, layers in ((FULL, layout.full_layers), (WINDOW, layout.window_layers)):
        if not layers:
            continue
        counts = [tiers[t].window if group == WINDOW else tiers[t].full for t in Tier]
        block_shape = (len(layers), 2, *buffers.block_shape)  # tiers.py's BlockData
        devices = [buffers.layer_devices[i] for i in layers]  # a CUDA one pins the host tier (pinned.py)
        stores: dict[Tier, TierStore] = {
            Tier.DEVICE: buffers.tier0_store(layers),
            Tier.HOST: HostStore(counts[Tier.HOST], block_shape, buffers.dtype, host_allocator(devices)),
        }
        if counts[Tier.NVME]:
            path = nvme_dir / f"wicore-kv-{os.getpid()}-{id(buffers)}-{group}.bin"
            try:
                stores[Tier.NVME] = NvmeStore(path, counts[Tier.NVME], block_shape, buffers.dtype)
            except WiCoreError:  # no room for this group's file: the other group's goes too
                for made in pagers:
                    store = made.stores.get(Tier.NVME)
                    if isinstance(store, NvmeStore):
                        store.close()
                raise
        pagers.append(Pager(stores))
        policy = A2CRPolicy(config.a2cr) if config.policy == "a2cr" else LRUPolicy()
        device, host, nvme = counts
        offload = group == FULL and config.kv_offload_tokens > 0  # wicore.kv.offload
        pools.append(
            BlockPool(device, host, nvme, layout.block_size, policy, config.enable_prefix_cache, group=group, offload=offload)
        )
    return KVCache(pools, pagers, layout.window if len(pools) > 1 else None)
