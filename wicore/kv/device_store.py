"""Tier 0 when the KV pools live in device memory: blocks copied by tiny ONNX graphs, in place.

The step graphs own no copy path for a pool held on a GPU, and NumPy cannot slice it. So the
store builds two graphs (wicore.devices.micrographs) over the pools of one device, runs them with a session on that device,
and binds each pool input to the pool's own OrtValue, each put output at the blocks' own
addresses: the same in-place trick as the step graphs, so no pool is ever copied whole. (A
ScatterND into the pools would write any frames in one run, but ONNX Runtime 1.31's moves fp16
blocks at ~0.5 GB/s on an H100; a put runs once per run of consecutive frames, at memory speed.)

    gather  frames [n] int64, key_cache.{l}, value_cache.{l}           (pools [N, bs, kvh, hd])
            Gather(pool_j, frames, axis=0) -> Unsqueeze(axis=1) ─┐  j = 2 * l + (0 key | 1 value)
            Concat(axis=1) over j ◄─────────────────────────────┘
            -> blocks [n, 2L, bs, kvh, hd]  bound to host memory: one device -> host copy

    put     blocks [n, 2L, bs, kvh, hd] (host)
            Gather(blocks, j, axis=1) -> pool_j_out   bound at n consecutive frames of pool j, so
                                                      one run writes a run of frames in place

On the host a block reads [L, 2, bs, kvh, hd] (tiers.py's BlockData): [n, 2L, ...] and
[n, L, 2, ...] are the same contiguous bytes, so the reshape is free. A run moves blocks
across all of the device's layers: a gather any frames, a put a run of consecutive ones. A
model split over several devices gets one OrtPoolStore per device, joined along the layer axis
by LayerSplitStore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import helper

from wicore.devices.micrographs import BLOCKS, FRAMES, copy_graph, gather_graph, pool_name, put_graph
from wicore.devices.providers import Device, onnxruntime, session_options

HOST_PIECE_BYTES = 64 << 20  # BlockCopier.from_host copies host blocks in pieces of at most this


class BlockCopier:
    """Copies blocks between the (key, value) buffers of one device, and between them and the host,
    by binding the buffers at the blocks' own addresses to a copy graph: one run per run of
    consecutive frames, moved at memory speed. (ONNX Runtime 1.31's ScatterND writes fp16 blocks at
    ~0.5 GB/s on an H100: 11.5 ms for 4 MB, tools/probe_kernels.py's kind of measurement.)"""

    def __init__(self, device: Device, dtype: np.dtype, block_shape: tuple[int, int, int], num_threads: int | None = 1) -> None:
        ort = onnxruntime()
        self.dtype = np.dtype(dtype)
        self.block_shape = block_shape
        self.block_bytes = int(np.prod(block_shape)) * self.dtype.itemsize
        self.kind, self.index = device.ort_device
        model = copy_graph(helper.np_dtype_to_tensor_dtype(self.dtype), block_shape).SerializeToString()
        self._session = ort.InferenceSession(
            model, sess_options=session_options(num_threads, devices=[device]), providers=device.providers()
        )

    def copy(self, src: tuple[Any, Any], src_frames: Sequence[int], dst: tuple[Any, Any], dst_frames: Sequence[int]) -> None:
        """dst[dst_frames[i]] = src[src_frames[i]] for key and value (device buffers)."""
        for s, d, n in _runs(src_frames, dst_frames):
            binding = self._session.io_binding()
            for kv, a, b in zip("kv", src, dst):
                shape = [n, *self.block_shape]
                binding.bind_input(kv, self.kind, self.index, self.dtype, shape, a.data_ptr() + s * self.block_bytes)
                binding.bind_output(f"{kv}_out", self.kind, self.index, self.dtype, shape, b.data_ptr() + d * self.block_bytes)
            self._session.run_with_iobinding(binding)

    def from_host(self, keys: np.ndarray, values: np.ndarray, dst: tuple[Any, Any], dst_frame: int) -> None:
        """dst[dst_frame:dst_frame + n] = keys, values (host blocks [n, *block_shape]), in pieces of at
        most HOST_PIECE_BYTES: ONNX Runtime copies a host input into a device buffer of its own first,
        and so holds no more than a piece of it at a time."""
        per_piece = max(1, HOST_PIECE_BYTES // self.block_bytes)
        for start in range(0, len(keys), per_piece):
            n = min(per_piece, len(keys) - start)
            binding = self._session.io_binding()
            for kv, blocks, b in zip("kv", (keys, values), dst):
                binding.bind_cpu_input(kv, blocks[start : start + n])
                address = b.data_ptr() + (dst_frame + start) * self.block_bytes
                binding.bind_output(f"{kv}_out", self.kind, self.index, self.dtype, [n, *self.block_shape], address)
            self._session.run_with_iobinding(binding)

    def to_host(self, src: tuple[Any, Any], frames: Sequence[int]) -> np.ndarray:
        """The blocks at `frames`, [len(frames), 2 (key, value), *block_shape], in host memory."""
        out = np.empty((len(frames), 2, *self.block_shape), self.dtype)
        done = 0
        for s, _, n in _runs(frames, range(len(frames))):
            binding = self._session.io_binding()
            for kv, a in zip("kv", src):
                binding.bind_input(
                    kv, self.kind, self.index, self.dtype, [n, *self.block_shape], a.data_ptr() + s * self.block_bytes
                )
                binding.bind_output(f"{kv}_out", "cpu")
            self._session.run_with_iobinding(binding)
            key, value = (v.numpy() for v in binding.get_outputs())
            out[done : done + n, 0], out[done : done + n, 1] = key, value
            done += n
        return out


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the runs in which both frame lists go up by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((int(s), int(d), 1))
    return runs


class OrtPoolStore:
    """Tier 0 over pools that are OrtValues on one device (any EP): copies by gather/scatter runs.

    `pools` holds one (key, value) OrtValue pair per layer covered, each [num_blocks, block_size,
    kv_heads, head_dim] of `dtype`; they must stay the runner's bound pools for the store's life
    (KVBuffers never reallocates them). Blocks read and written are
    [num_layers, 2, block_size, kv_heads, head_dim] host arrays, as for every TierStore.
    """

    def __init__(self, pools: Sequence[tuple[Any, Any]], dtype: np.dtype, device: Device, num_threads: int | None = 1) -> None:
        if not pools:
            raise ValueError("OrtPoolStore needs the pools of at least one layer")
        ort = onnxruntime()
        self.dtype = np.dtype(dtype)
        self.device = device
        self._pools = [value for pair in pools for value in pair]  # pool j = layer j // 2, k/v j % 2
        shape = tuple(self._pools[0].shape())
        for value in self._pools:
            if tuple(value.shape()) != shape:
                raise ValueError(f"pools of one store must share a shape: {tuple(value.shape())} != {shape}")
        self.num_frames = shape[0]
        self.num_layers = len(pools)
        self.block_shape = (self.num_layers, 2, *shape[1:])
        elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        opts = session_options(num_threads, devices=[device])
        providers = device.providers()
        self._gather = ort.InferenceSession(
            gather_graph(len(self._pools), elem, shape[1:]).SerializeToString(), sess_options=opts, providers=providers
        )
        self._put = ort.InferenceSession(
            put_graph(len(self._pools), elem, shape[1:]).SerializeToString(), sess_options=opts, providers=providers
        )
        self._frame_bytes = int(np.prod(shape[1:])) * self.dtype.itemsize

    def _frame_array(self, frames: Sequence[int]) -> np.ndarray:
        ids = np.asarray(frames, np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.num_frames)]
        if bad.size:
            raise IndexError(f"KV block frame {int(bad[0])} is out of range for a device pool of {self.num_frames} blocks")
        return ids

    def read(self, frame: int) -> np.ndarray:
        return self.read_many([frame])[0]

    def write(self, frame: int, data: np.ndarray) -> None:
        self.write_many([frame], np.asarray(data)[None])

    def read_many(self, frames: Sequence[int]) -> np.ndarray:
        """The blocks in `frames`, [len(frames), num_layers, 2, block_size, kv_heads, head_dim]; one run."""
        ids = self._frame_array(frames)
        if not ids.size:
            return np.zeros((0, *self.block_shape), self.dtype)
        binding = self._gather.io_binding()
        binding.bind_cpu_input(FRAMES, ids)
        for j, value in enumerate(self._pools):
            binding.bind_ortvalue_input(pool_name(j), value)
        binding.bind_output(BLOCKS, "cpu")
        self._gather.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy().reshape(len(ids), *self.block_shape)

    def write_many(self, frames: Sequence[int], data: np.ndarray) -> None:
        """Overwrite each of the distinct `frames` with its block of `data` [len(frames), num_layers, 2, ...]:
        one run per run of consecutive frames (sorted first)."""
        ids = self._frame_array(frames)
        if len(set(ids.tolist())) != len(ids):
            raise ValueError(f"write_many got a frame twice: {ids.tolist()}")
        data = np.asarray(data)
        if data.shape != (len(ids), *self.block_shape):
            raise ValueError(f"blocks of shape {data.shape} for {len(ids)} frames of {self.block_shape}")
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        blocks = np.ascontiguousarray(data[order], self.dtype).reshape(len(ids), 2 * self.num_layers, *self.block_shape[2:])
        kind, index = self.device.ort_device
        for start, done, n in _runs(ids.tolist(), range(len(ids))):
            binding = self._put.io_binding()
            binding.bind_cpu_input(BLOCKS, blocks[done : done + n])
            for j, value in enumerate(self._pools):
                address = value.data_ptr() + start * self._frame_bytes
                binding.bind_output(f"{pool_name(j)}_out", kind, index, self.dtype, [n, *self.block_shape[2:]], address)
            self._put.run_with_iobinding(binding)


class LayerSplitStore:
    """Tier 0 of a model whose layers sit on several devices: one store per run of layers,
    their blocks joined along the layer axis in layer order."""

    def __init__(self, stores: Sequence[OrtPoolStore]) -> None:
        if len({s.num_frames for s in stores}) != 1:
            raise ValueError("every device's pool must hold the same number of blocks")
        self.stores = list(stores)
        self.num_frames = self.stores[0].num_frames
        self._bounds = np.cumsum([0] + [s.num_layers for s in self.stores]).tolist()

    def read(self, frame: int) -> np.ndarray:
        return self.read_many([frame])[0]

    def write(self, frame: int, data: np.ndarray) -> None:
        self.write_many([frame], np.asarray(data)[None])

    def read_many(self, frames: Sequence[int]) -> np.ndarray:
        return np.concatenate([s.read_many(frames) for s in self.stores], axis=1)

    def write_many(self, frames: Sequence[int], data: np.ndarray) -> None:
        data = np.asarray(data)
        if data.ndim < 2 or data.shape[1] != self._bounds[-1]:
            raise ValueError(f"blocks of shape {data.shape} for a store of {self._bounds[-1]} layers")
        for store, start, stop in zip(self.stores, self._bounds, self._bounds[1:]):
            store.write_many(frames, data[:, start:stop])


def ort_pool_store(
    pools: Sequence[tuple[object, object]], devices: Sequence[Device], dtype: np.dtype, num_threads: int | None = 1
) -> OrtPoolStore | LayerSplitStore:
    """Tier 0 over per-layer pools on per-layer `devices`: one OrtPoolStore per run of
    consecutive layers on one device, joined when there are several."""
    if not pools or len(pools) != len(devices):
        raise ValueError(f"{len(pools)} layers of pools for {len(devices)} devices")
    stores = []
    start = 0
    for stop in range(1, len(pools) + 1):
        if stop == len(pools) or devices[stop] != devices[start]:
            stores.append(OrtPoolStore(pools[start:stop], dtype, devices[start], num_threads))
            start = stop
    return stores[0] if len(stores) == 1 else LayerSplitStore(stores)
