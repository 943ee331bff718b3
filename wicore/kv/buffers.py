"""The KV buffers: each layer's key and value tensors, allocated once on its partition's device.

    layer i:  key_cache.{i}, value_cache.{i}   [num_blocks, block_size, kv_heads, head_dim (int8: + 1)]

The graphs bind them in place (wicore.executor.graphs) and the pager reads and writes blocks
of them (tier 0 of the KV cache). Both hold this one object, which never reallocates, so
neither can be left with a stale buffer. On a CPU device a buffer is a NumPy array bound
zero-copy and paged by NumPy slices; on an accelerator it exists only as an OrtValue, paged by
small gather / scatter graphs on its device (wicore.kv.device_store). Buffers are
zero-filled: masked-out slots must hold finite values (0 x NaN is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wicore.devices.device_alloc import buffer_pair
from wicore.devices.providers import Device
from wicore.graph.manifest import Manifest
from wicore.kv.device_store import ort_pool_store
from wicore.kv.tiers import DeviceStore, TierStore


@dataclass(frozen=True)
class CacheConfig:
    """Blocks of the full-attention layers' buffers and of the sliding layers' (by default as many)."""

    num_blocks: int
    block_size: int = 16
    num_window_blocks: int | None = None

    def __post_init__(self) -> None:
        if min(self.num_blocks, self.window_blocks) < 2:
            raise ValueError("a KV buffer needs at least 2 blocks (one is the padding sink)")
        if self.block_size < 1:
            raise ValueError("block_size must be positive")

    @property
    def window_blocks(self) -> int:
        return self.num_blocks if self.num_window_blocks is None else self.num_window_blocks


class KVBuffers:
    """Per-layer key / value buffers of one model, on the devices its partitions run on."""

    def __init__(self, manifest: Manifest, cache: CacheConfig, devices: Sequence[Device]) -> None:
        cfg = manifest.config
        self.cache = cache
        self.dtype = np.dtype(manifest.kv_dtype)
        self.block_shape = (cache.block_size, cfg.num_kv_heads, manifest.kv_width)  # one layer's K (or V) of a block
        self.layer_devices: list[Device] = [d for p, d in zip(manifest.partitions, devices) for _ in range(p.start, p.stop)]
        self._arrays: list[tuple[np.ndarray, np.ndarray] | None] = []  # host-memory buffers
        self._values: list[tuple[Any, Any]] = []  # the OrtValues the graphs bind
        for layer, device in enumerate(self.layer_devices):
            num_blocks = cache.window_blocks if cfg.is_sliding(layer) else cache.num_blocks
            values, arrays = buffer_pair(device, (num_blocks, *self.block_shape), self.dtype)
            self._values.append(values)
            self._arrays.append(arrays)

    @property
    def num_layers(self) -> int:
        return len(self._values)

    def values(self, layer: int) -> tuple[Any, Any]:
        """The layer's (key, value) OrtValues, to bind as a graph's input and output at once."""
        return self._values[layer]

    def arrays(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The layer's (key, value) NumPy arrays, when they live in host memory."""
        return self._arrays[layer]

    def tier0_store(self, layers: Sequence[int]) -> TierStore:
        """A store over the buffers of `layers` (one block group): blocks read and written in place."""
        arrays = [self._arrays[i] for i in layers]
        if all(a is not None for a in arrays):
            return DeviceStore([a[0] for a in arrays if a], [a[1] for a in arrays if a])
        return ort_pool_store([self._values[i] for i in layers], [self.layer_devices[i] for i in layers], self.dtype)
