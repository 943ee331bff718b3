"""Streamed steps: full-attention KV larger than the device tier, staged for each step.

With `EngineConfig.kv_stream_tokens`, a sequence may keep some of its full-attention blocks in
host memory while it runs (wicore.hmt.block_pool, `stream`). A graph reads one buffer per layer,
so a graph run over such rows gives each full-attention layer a *stage*: a buffer on the layer's
device that the run fills with its rows' blocks, row after row, just before the partition runs,
and whose newly written tokens go back to their blocks' homes right after:

    stage frame   0      1 .. n0            n0 + 1 .. n0 + n1    ...
                  sink   row 0's blocks     row 1's blocks
    before a partition, each of its full layers:   DEVICE blocks  pool ──► stage   (on the device)
                                                   HOST blocks    host ──► stage   (copied in)
    after it:     the blocks the run wrote         stage ──► their DEVICE or HOST frame

The full-attention layers of different partitions run one after another, so they share stages:
one per full layer of a partition (`wicore-export --partitions`, ideally one such layer each).
The device then holds one layer's stage where it would hold every layer's blocks of the long
sequences; the price is copying their host blocks in at every step (and the device ones once
more on the device). Every token is still attended: the tokens are HF's, only slower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import helper

from wicore.graph.manifest import Manifest
from wicore.hmt.tiers import HostStore, Tier
from wicore.runtime.device_store import OrtPoolStore, copy_graph
from wicore.runtime.kv_buffers import KVBuffers
from wicore.runtime.providers import Device, onnxruntime, session_options
from wicore.runtime.step import ScheduledRow


@dataclass(frozen=True)
class StagePlan:
    """One graph run's staging, integers only: the rows with their full-attention tables made stage
    frames, where each staged block comes from, and where the blocks the run writes go back."""

    rows: list[ScheduledRow]
    num_frames: int  # stage frames used, the sink included
    device_src: np.ndarray  # DEVICE frames staged ...
    device_dst: np.ndarray  # ... into these stage frames
    host_src: np.ndarray  # HOST frames staged ...
    host_dst: np.ndarray  # ... into these
    back_device_src: np.ndarray  # stage frames the run writes whose block lies on DEVICE ...
    back_device_dst: np.ndarray  # ... at these frames
    back_host_src: np.ndarray  # the same for blocks on HOST
    back_host_dst: np.ndarray


def plan_stage(rows: Sequence[ScheduledRow], block_size: int, num_frames: int, has_window: bool) -> StagePlan:
    """Lay `rows` out in a stage of `num_frames` frames (frame 0 is the sink, as in a pool). A row
    with `full_locations` is streamed; the others' blocks are all on DEVICE (`block_table`). A model
    without sliding layers reads its full table as the window table too: that one becomes the
    stage frames as well."""
    out: list[ScheduledRow] = []
    lists: dict[str, list[int]] = {
        k: [] for k in ("dev_s", "dev_d", "host_s", "host_d", "bdev_s", "bdev_d", "bhost_s", "bhost_d")
    }
    base = 1
    for row in rows:
        locations = row.full_locations or tuple((Tier.DEVICE, f) for f in row.block_table)
        frames = list(range(base, base + len(locations)))
        written = range(row.start // block_size, (row.start + len(row.token_ids) - 1) // block_size + 1)
        for j, ((tier, frame), stage) in enumerate(zip(locations, frames)):
            on_device = tier is Tier.DEVICE
            if tier not in (Tier.DEVICE, Tier.HOST):
                raise ValueError(f"request {row.request_id}: a block in {tier.name} cannot be staged (lift it first)")
            lists["dev_s" if on_device else "host_s"].append(frame)
            lists["dev_d" if on_device else "host_d"].append(stage)
            if j in written:
                lists["bdev_s" if on_device else "bhost_s"].append(stage)
                lists["bdev_d" if on_device else "bhost_d"].append(frame)
        window = {} if has_window else {"window_table": frames, "window_first": 0}
        out.append(dataclasses.replace(row, block_table=frames, full_locations=(), **window))  # type: ignore[arg-type]
        base += len(locations)
    if base > num_frames:
        raise ValueError(f"the rows stage {base - 1} blocks, the stage holds {num_frames - 1} (the scheduler keeps steps within)")
    a = {k: np.asarray(v, np.int64) for k, v in lists.items()}
    return StagePlan(
        out, base, a["dev_s"], a["dev_d"], a["host_s"], a["host_d"], a["bdev_s"], a["bdev_d"], a["bhost_s"], a["bhost_d"]
    )


def num_stages(manifest: Manifest) -> int:
    """Stages a model streams with: the most full-attention layers one partition holds (one device)."""
    cfg = manifest.config
    return max(sum(not cfg.is_sliding(i) for i in range(p.start, p.stop)) for p in manifest.partitions)


@dataclass
class StreamStats:
    """Blocks staged and written back, counted per full-attention layer."""

    num_runs: int = 0  # graph runs that staged
    num_device_blocks: int = 0  # staged from the device tier (a copy on the device)
    num_host_blocks: int = 0  # staged from host memory (a copy in)
    num_written_back: int = 0


@dataclass
class _Stage:
    """One stage buffer pair: its OrtValues, its NumPy arrays on a CPU device, else a store that
    copies host blocks in and out of it."""

    values: tuple[Any, Any]
    arrays: tuple[np.ndarray, np.ndarray] | None
    store: OrtPoolStore | None


class KVStreamer:
    """The stages of one model and the copies in and out of them (see the module docstring)."""

    def __init__(
        self, manifest: Manifest, buffers: KVBuffers, host: HostStore, num_frames: int, num_threads: int | None = 1
    ) -> None:
        ort = onnxruntime()
        cfg = manifest.config
        self.num_frames = num_frames
        self.buffers = buffers
        self.host = host
        self.stats = StreamStats()
        full = [i for i in range(cfg.num_layers) if not cfg.is_sliding(i)]
        self.has_window = len(full) < cfg.num_layers
        self._group_index = {layer: k for k, layer in enumerate(full)}  # the layer in the host store's blocks
        self._layers = [[i for i in range(p.start, p.stop) if i in self._group_index] for p in manifest.partitions]
        self._stages: dict[int, _Stage] = {}  # full layer -> its stage (shared across partitions)
        by_slot: dict[tuple[str, int], _Stage] = {}
        self._copies: dict[str, Any] = {}  # device label -> copy session (accelerators)
        for layers in self._layers:
            for slot, layer in enumerate(layers):
                device = buffers.layer_devices[layer]
                key = (device.label, slot)
                if key not in by_slot:
                    by_slot[key] = self._new_stage(device, num_threads)
                self._stages[layer] = by_slot[key]
                if by_slot[key].arrays is None and device.label not in self._copies:
                    elem = helper.np_dtype_to_tensor_dtype(buffers.dtype)
                    model = copy_graph(elem, buffers.block_shape).SerializeToString()
                    opts = session_options(num_threads)
                    self._copies[device.label] = ort.InferenceSession(model, sess_options=opts, providers=device.providers())
        self.num_stages = len(by_slot)

    def _new_stage(self, device: Device, num_threads: int | None) -> _Stage:
        ort = onnxruntime()
        kind, index = device.ort_device
        shape = (self.num_frames, *self.buffers.block_shape)
        key, value = np.zeros(shape, self.buffers.dtype), np.zeros(shape, self.buffers.dtype)
        values = (ort.OrtValue.ortvalue_from_numpy(key, kind, index), ort.OrtValue.ortvalue_from_numpy(value, kind, index))
        if kind == "cpu":
            return _Stage(values, (key, value), None)
        return _Stage(values, None, OrtPoolStore([values], self.buffers.dtype, device, num_threads))

    def stage_bytes(self) -> int:
        """Device (or host, on a CPU EP) bytes the stages take."""
        return self.num_stages * 2 * self.num_frames * int(np.prod(self.buffers.block_shape)) * self.buffers.dtype.itemsize

    def run(self, plan: StagePlan) -> StagedRun:
        self.stats.num_runs += 1
        return StagedRun(self, plan)

    def stage(self, partition: int, plan: StagePlan) -> None:
        """Fill the stages of the partition's full layers with the plan's blocks."""
        for layer in self._layers[partition]:
            stage = self._stages[layer]
            self._copy(layer, self._pool(layer), plan.device_src, stage, plan.device_dst)
            if len(plan.host_src):
                blocks = self.host.read_layer(plan.host_src, self._group_index[layer])  # [m, 2, bs, kvh, w]
                if stage.arrays is not None:
                    stage.arrays[0][plan.host_dst], stage.arrays[1][plan.host_dst] = blocks[:, 0], blocks[:, 1]
                else:
                    assert stage.store is not None
                    stage.store.write_many(plan.host_dst.tolist(), blocks[:, None])
            self.stats.num_device_blocks += len(plan.device_src)
            self.stats.num_host_blocks += len(plan.host_src)

    def unstage(self, partition: int, plan: StagePlan) -> None:
        """Copy the blocks the run wrote from the partition's stages back to where they lie."""
        for layer in self._layers[partition]:
            stage = self._stages[layer]
            self._copy(layer, stage, plan.back_device_src, self._pool(layer), plan.back_device_dst)
            if len(plan.back_host_src):
                if stage.arrays is not None:
                    blocks = np.stack([stage.arrays[0][plan.back_host_src], stage.arrays[1][plan.back_host_src]], axis=1)
                else:
                    assert stage.store is not None
                    blocks = stage.store.read_many(plan.back_host_src.tolist())[:, 0]
                self.host.write_layer(plan.back_host_dst, self._group_index[layer], blocks)
            self.stats.num_written_back += len(plan.back_device_src) + len(plan.back_host_src)

    def values(self, layer: int) -> tuple[Any, Any] | None:
        """The stage a full layer reads in a staged run; None for a sliding layer (its own pool)."""
        stage = self._stages.get(layer)
        return None if stage is None else stage.values

    def _pool(self, layer: int) -> _Stage:
        return _Stage(self.buffers.values(layer), self.buffers.arrays(layer), None)

    def _copy(self, layer: int, src: _Stage, src_frames: np.ndarray, dst: _Stage, dst_frames: np.ndarray) -> None:
        """dst[dst_frames] = src[src_frames], key and value, on the layer's device."""
        if not len(src_frames):
            return
        if src.arrays is not None and dst.arrays is not None:
            for a, b in zip(src.arrays, dst.arrays):
                b[dst_frames] = a[src_frames]
            return
        session = self._copies[self.buffers.layer_devices[layer].label]
        binding = session.io_binding()
        binding.bind_cpu_input("src_frames", src_frames)
        binding.bind_cpu_input("dst_frames", dst_frames.reshape(-1, 1))
        for kv, s, d in zip("kv", src.values, dst.values):
            binding.bind_ortvalue_input(f"src_{kv}", s)
            binding.bind_ortvalue_input(f"dst_{kv}", d)
            binding.bind_ortvalue_output(f"dst_{kv}_out", d)
        session.run_with_iobinding(binding)


class StagedRun:
    """One graph run over staged rows: ModelGraphs.run calls `before` and `after` around each
    partition and binds `values(layer)`, where not None, as the layer's KV buffers."""

    def __init__(self, streamer: KVStreamer, plan: StagePlan) -> None:
        self.streamer = streamer
        self.plan = plan

    def before(self, partition: int) -> None:
        self.streamer.stage(partition, self.plan)

    def after(self, partition: int) -> None:
        self.streamer.unstage(partition, self.plan)

    def values(self, layer: int) -> tuple[Any, Any] | None:
        return self.streamer.values(layer)
