"""How the engine's KV memory is laid out: block groups, blocks per tier, stores and pagers.

The full-attention layers and the sliding-window layers are two block groups
(wicore.hmt.kv_cache). Each tier's byte budget is shared between them: the window group
gets what its running sequences can use at most, its window (plus a prefill chunk)
each, capped at an even split; the full group gets the rest. So at long context most
of the memory goes to the full-attention layers, whose blocks cover the whole context.

    bytes per block   full:   num_full_layers   * 2 * block_size * kv_heads * head_dim * itemsize
                      window: num_window_layers * 2 * block_size * kv_heads * head_dim * itemsize
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wicore.graph.manifest import Manifest
from wicore.hmt.block_pool import BlockPool
from wicore.hmt.device_store import ort_pool_store
from wicore.hmt.kv_cache import FULL, WINDOW, KVCache
from wicore.hmt.pager import Pager
from wicore.hmt.policy import A2CRPolicy, LRUPolicy, Tier
from wicore.hmt.tiers import DeviceStore, HostStore, NvmeStore

GIB = 1 << 30


@dataclass(frozen=True)
class KVLayout:
    """The layers of each block group and the bytes of one block of each."""

    full_layers: tuple[int, ...]
    window_layers: tuple[int, ...]
    window: int  # tokens a sliding layer sees
    block_size: int
    layer_block_bytes: int  # K and V of one layer's block

    @classmethod
    def of(cls, manifest: Manifest, block_size: int) -> KVLayout:
        cfg = manifest.config
        sliding = tuple(i for i in range(cfg.num_layers) if cfg.is_sliding(i))
        full = tuple(i for i in range(cfg.num_layers) if not cfg.is_sliding(i))
        if not full:
            raise ValueError("the engine needs at least one full-attention layer")
        itemsize = np.dtype(manifest.kv_dtype).itemsize
        return cls(full, sliding, cfg.sliding_window, block_size, 2 * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize)

    @property
    def has_window(self) -> bool:
        return bool(self.window_layers)

    def block_bytes(self, group: int) -> int:
        return len(self.window_layers if group == WINDOW else self.full_layers) * self.layer_block_bytes

    def window_blocks_per_sequence(self, prefill_chunk: int) -> int:
        """Most window blocks one sequence holds in a step: its window plus a prefill chunk."""
        return math.ceil((self.window - 1 + prefill_chunk) / self.block_size) + 1

    def split(self, num_bytes: float, window_need: int) -> tuple[int, int]:
        """(full, window) blocks from a byte budget: the window group takes at most
        `window_need` blocks and at most an even split; the full group the rest."""
        if not self.has_window:
            return int(num_bytes // self.block_bytes(FULL)), 0
        window = min(int(num_bytes // (self.block_bytes(FULL) + self.block_bytes(WINDOW))), window_need)
        return int((num_bytes - window * self.block_bytes(WINDOW)) // self.block_bytes(FULL)), window


@dataclass(frozen=True)
class TierBlocks:
    """Blocks of each group in one tier (the device tier counts the sink)."""

    full: int
    window: int


def plan_tiers(config, layout: KVLayout) -> dict[Tier, TierBlocks]:
    """Blocks per group and tier from an EngineConfig. Explicit block counts (num_*_blocks)
    apply to both groups alike."""
    sched = config.scheduler
    need = sched.max_num_seqs * layout.window_blocks_per_sequence(sched.prefill_chunk) + 1
    device = layout.split(config.kv_pool_gb * GIB, need)
    device = TierBlocks(max(2, device[0]), max(2, device[1]) if layout.has_window else 0)
    # The lower tiers hold what device blocks are demoted or swapped to: same byte shares.
    share = device.window * layout.block_bytes(WINDOW) / (
        device.window * layout.block_bytes(WINDOW) + device.full * layout.block_bytes(FULL)
    )
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


class KVMemory:
    """The block groups' pools (as a KVCache), their tier stores and one pager per group."""

    def __init__(self, config, layout: KVLayout, tiers: dict[Tier, TierBlocks], runner) -> None:
        self.layout = layout
        self._nvme: list[NvmeStore] = []
        pools, self.pagers = [], []
        dtype = np.dtype(runner.manifest.kv_dtype)
        cfg = runner.manifest.config
        for group, layers in ((FULL, layout.full_layers), (WINDOW, layout.window_layers)):
            if not layers:
                continue
            counts = [getattr(tiers[t], "window" if group == WINDOW else "full") for t in Tier]
            block_shape = (len(layers), 2, layout.block_size, cfg.num_kv_heads, cfg.head_dim)
            stores = {Tier.DEVICE: self._device_store(runner, list(layers), dtype), Tier.HOST: HostStore(counts[1], block_shape, dtype)}
            if counts[2]:
                nvme_dir = Path(config.nvme_dir or tempfile.gettempdir())
                path = nvme_dir / f"wicore-kv-{os.getpid()}-{id(self)}-{group}.bin"
                stores[Tier.NVME] = NvmeStore(path, counts[2], block_shape, dtype)
                self._nvme.append(stores[Tier.NVME])
            self.pagers.append(Pager(stores))
            policy = A2CRPolicy(config.a2cr) if config.policy == "a2cr" else LRUPolicy()
            pools.append(BlockPool(*counts, layout.block_size, policy, config.enable_prefix_cache, group=group))
        self.cache = KVCache(pools[0], *((pools[1], layout.window) if len(pools) > 1 else ()))

    @staticmethod
    def _device_store(runner, layers: list[int], dtype: np.dtype):
        if runner.pools_on_host:
            return DeviceStore([runner.key_pools[i] for i in layers], [runner.value_pools[i] for i in layers])
        # pools in device memory: blocks move by small gather/scatter graphs on their device
        values, devices = runner.pool_values, runner.layer_devices
        return ort_pool_store([values[i] for i in layers], [devices[i] for i in layers], dtype)

    def execute(self, moves) -> set[tuple[int, int]]:
        """Run a plan's moves, each by its group's pager; (group, block id) of corrupt blocks."""
        corrupt: set[tuple[int, int]] = set()
        for group, pager in enumerate(self.pagers):
            mine = [m for m in moves if m.group == group]
            if mine:
                corrupt |= {(group, b) for b in pager.execute(mine)}
        return corrupt

    @property
    def num_corrupt(self) -> int:
        return sum(p.stats.num_corrupt for p in self.pagers)

    def close(self) -> None:
        for store in self._nvme:
            store.close()
        self._nvme = []
