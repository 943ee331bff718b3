"""Tier stores: where a block's bytes live. The block pool decides, these copy.

A block's bytes are the K and V of `block_size` tokens in every layer:

    BlockData: float array [num_layers, 2 (k, v), block_size, num_kv_heads, head_dim]

    tier 0  DeviceStore  the pools bound to the graphs (NumPy on the CPU EP: copies are slices);
                         pools in device memory: OrtPoolStore (device_store.py), gather/put graphs
    tier 1  HostStore    one NumPy array [num_layers, 2, num_frames, *token shape]: layer-major, as
                         a streamed step reads it (one layer at a time)
    tier 2  NvmeStore    an np.memmap file [num_frames, *block shape]: block-major, each block one
                         range with a checksum that is checked on every read (a corrupt block
                         raises CorruptBlockError, it is never returned)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from wicore.errors import WiCoreError


class CorruptBlockError(WiCoreError):
    """A block read back from NVMe does not match the checksum written with it."""

    def __init__(self, frame: int, path: Path) -> None:
        super().__init__(f"KV block in frame {frame} of {path} is corrupt (checksum mismatch)")
        self.frame = frame


class TierStore(Protocol):
    num_frames: int

    def read(self, frame: int) -> np.ndarray:
        """The block's bytes, [num_layers, 2, block_size, kv_heads, head_dim]."""

    def write(self, frame: int, data: np.ndarray) -> None:
        """Overwrite the frame with `data` (same layout as `read`)."""


@runtime_checkable
class BatchedTierStore(TierStore, Protocol):
    """A store that moves many blocks in one call (one graph run for device pools)."""

    def read_many(self, frames: Sequence[int]) -> np.ndarray:
        """The blocks in `frames`, [len(frames), num_layers, 2, block_size, kv_heads, head_dim]."""

    def write_many(self, frames: Sequence[int], data: np.ndarray) -> None:
        """Overwrite each of the distinct `frames` with its block of `data`."""


class DeviceStore:
    """Tier 0 on the CPU EP: the runner's per-layer pools, [num_blocks, block_size, kvh, hd] each."""

    def __init__(self, key_pools: list[np.ndarray], value_pools: list[np.ndarray]) -> None:
        self.key_pools = key_pools
        self.value_pools = value_pools
        self.num_frames = key_pools[0].shape[0]

    def read(self, frame: int) -> np.ndarray:
        return np.stack([np.stack([k[frame], v[frame]]) for k, v in zip(self.key_pools, self.value_pools)])

    def write(self, frame: int, data: np.ndarray) -> None:
        for layer, (k, v) in enumerate(zip(self.key_pools, self.value_pools)):
            k[frame] = data[layer, 0]
            v[frame] = data[layer, 1]


class HostStore:
    """Tier 1, layer-major: data [num_layers, 2 (k, v), num_frames, *token shape], so that one layer's
    keys (or values) of consecutive frames are one contiguous slice, which a streamed step copies to
    the device as it lies (wicore.kv.stream). `allocate(shape, dtype)` makes the zeroed array:
    page-locked memory when the pools are on a CUDA device (wicore.devices.pinned)."""

    def __init__(
        self,
        num_frames: int,
        block_shape: tuple[int, ...],
        dtype: np.dtype,
        allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.zeros,
    ) -> None:
        num_layers, two, *token_shape = block_shape
        self.num_frames = num_frames
        self.data = allocate((num_layers, two, num_frames, *token_shape), np.dtype(dtype))

    def read(self, frame: int) -> np.ndarray:
        return self.data[:, :, frame].copy()

    def write(self, frame: int, data: np.ndarray) -> None:
        self.data[:, :, frame] = data

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """One layer's keys and values, [num_frames, block_size, kv_heads, head_dim] each: views."""
        return self.data[layer, 0], self.data[layer, 1]


class NvmeStore:
    """A memory-mapped file on fast local storage, with a BLAKE2b digest per frame.

    The file is `wicore-kv-<pid>-*.bin`, readable by its owner only (it holds the users' KV);
    `close` deletes it, and `remove_stale` deletes those of processes that died without closing."""

    PATTERN = "wicore-kv-*.bin"

    def __init__(self, path: Path, num_frames: int, block_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.num_frames = num_frames
        shape = (max(num_frames, 1), *block_shape)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
            os.ftruncate(fd, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        finally:
            os.close(fd)
        self.data = np.memmap(self.path, dtype=dtype, mode="r+", shape=shape)
        self._digests: list[bytes | None] = [None] * num_frames

    @classmethod
    def remove_stale(cls, folder: Path) -> list[Path]:
        """Delete the NVMe tier files in `folder` whose process is gone (a SIGKILL leaves them)."""
        removed = []
        for path in Path(folder).glob(cls.PATTERN):
            pid = path.name.split("-")[2]
            if pid.isdigit() and not _alive(int(pid)):
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed

    @staticmethod
    def _digest(data: np.ndarray) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(data).data, digest_size=16).digest()

    def read(self, frame: int) -> np.ndarray:
        data = np.array(self.data[frame])
        if self._digests[frame] is None or self._digest(data) != self._digests[frame]:
            raise CorruptBlockError(frame, self.path)
        return data

    def write(self, frame: int, data: np.ndarray) -> None:
        self.data[frame] = data
        self._digests[frame] = self._digest(self.data[frame])

    def close(self) -> None:
        """Drop the mapping and delete the file (its contents are a cache, not data)."""
        del self.data
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
