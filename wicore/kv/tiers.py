"""Tier stores: where a block's bytes live. The block pool decides, these copy.

A block's bytes are the K and V of `block_size` tokens in every layer:

    BlockData: float array [num_layers, 2 (k, v), block_size, num_kv_heads, head_dim]

    tier 0  DeviceStore  the pools bound to the graphs (NumPy on the CPU EP: copies are slices);
                         pools in device memory: OrtPoolStore (device_store.py), gather/put graphs
    tier 1  HostStore    one NumPy array [num_layers, 2, num_frames, *token shape]: layer-major, as
                         an offloaded step reads it (one layer at a time)
    tier 2  NvmeStore    a file [num_frames, *block shape], reserved at start: block-major, each
                         block one range with a checksum that is checked on every read (a corrupt
                         block, or one whose write failed, raises CorruptBlockError: never returned)
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from wicore.errors import WiCoreError

log = logging.getLogger("wicore.kv")


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
    keys (or values) of consecutive frames are one contiguous slice, which an offloaded step copies to
    the device as it lies (wicore.kv.offload). `allocate(shape, dtype)` makes the zeroed array:
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
    """A file on fast local storage, one range per frame, with a BLAKE2b digest per frame.

    The file is `wicore-kv-<pid>-*.bin`, readable by its owner only (it holds the users' KV),
    created with O_EXCL | O_NOFOLLOW (a link planted in a shared folder is never followed) and
    its whole size reserved at start (`reserve`): a tier the filesystem cannot hold is refused
    then, with the free space named. Frames move with pread / pwrite, never through a memory
    map: a write that cannot land (EIO, a full filesystem after all) leaves its frame without a
    digest, so reading it raises CorruptBlockError, the lost-block event the KV cache handles
    (its holders recompute), where a mapped page would have killed the process with SIGBUS.
    `close` deletes the file, and `remove_stale` deletes those of processes that died without closing."""

    PATTERN = "wicore-kv-*.bin"

    def __init__(self, path: Path, num_frames: int, block_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path = Path(path)
        self.num_frames = num_frames
        self.block_shape = tuple(block_shape)
        self.dtype = np.dtype(dtype)
        self.frame_bytes = int(np.prod(self.block_shape)) * self.dtype.itemsize
        self.num_lost_writes = 0  # writes that did not land (their frames read as corrupt)
        self._fd = reserve(self.path, max(num_frames, 1) * self.frame_bytes)
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
    def _digest(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=16).digest()

    def read(self, frame: int) -> np.ndarray:
        try:
            raw = os.pread(self._fd, self.frame_bytes, frame * self.frame_bytes)
        except OSError:  # an I/O error: the block is as lost as a corrupt one
            raw = b""
        if self._digests[frame] is None or len(raw) != self.frame_bytes or self._digest(raw) != self._digests[frame]:
            raise CorruptBlockError(frame, self.path)
        return np.frombuffer(raw, self.dtype).reshape(self.block_shape).copy()

    def write(self, frame: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data, dtype=self.dtype).tobytes()
        self._digests[frame] = None  # lost until the new bytes have landed
        view, offset = memoryview(raw), frame * self.frame_bytes
        try:
            while view:
                written = os.pwrite(self._fd, view, offset)
                view, offset = view[written:], offset + written
        except OSError as exc:
            self.num_lost_writes += 1
            if self.num_lost_writes == 1 or self.num_lost_writes % 1000 == 0:
                log.warning(
                    "a KV block could not be written to %s (%s; %d so far): its requests will recompute it",
                    self.path,
                    exc.strerror,
                    self.num_lost_writes,
                )
            return
        self._digests[frame] = self._digest(raw)

    def close(self) -> None:
        """Close and delete the file (its contents are a cache, not data)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


def reserve(path: Path, num_bytes: int) -> int:
    """A new file at `path` (owner-only, no link followed) with `num_bytes` allocated on disk, open
    for reading and writing; a WiCoreError naming the folder's free space where it does not fit."""
    folder = path.parent
    where = f"the NVMe KV tier folder {folder} (nvme_dir)"
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        raise WiCoreError(f"cannot use {where}: {exc.strerror or exc}") from None
    if num_bytes > free:
        raise WiCoreError(
            f"the NVMe KV tier needs {_gib(num_bytes)} but {where} has {_gib(free)} free: "
            "lower nvme_tier_gb or choose another nvme_dir"
        )
    fd = _create(path, where)
    try:
        _allocate(fd, num_bytes)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        free = shutil.disk_usage(folder).free
        raise WiCoreError(
            f"cannot reserve {_gib(num_bytes)} for the NVMe KV tier in {where} ({exc.strerror}; {_gib(free)} free): "
            "lower nvme_tier_gb or choose another nvme_dir"
        ) from None
    return fd


def _create(path: Path, where: str) -> int:
    """Open a new owner-only file; one of our own of that name (this pid, an earlier engine) is replaced."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for attempt in (1, 2):
        try:
            return os.open(path, flags, 0o600)
        except FileExistsError:
            if attempt == 2 or path.is_symlink() or not path.is_file():
                raise WiCoreError(f"{path} exists and is not a file this server may replace; remove it ({where})") from None
            try:
                path.unlink()  # ours: a sticky shared folder lets nobody else remove it
            except OSError as exc:
                raise WiCoreError(f"{path} exists and cannot be replaced ({exc.strerror}); remove it ({where})") from None
        except OSError as exc:
            raise WiCoreError(f"cannot create {path} in {where}: {exc.strerror}") from None
    raise AssertionError("unreachable")


def _allocate(fd: int, num_bytes: int) -> None:
    """Allocate the file's blocks now (not a sparse file whose writes may find no space later)."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, num_bytes)
        return
    zeros = bytes(1 << 20)  # macOS: write them
    for offset in range(0, num_bytes, len(zeros)):
        os.pwrite(fd, zeros[: min(len(zeros), num_bytes - offset)], offset)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
