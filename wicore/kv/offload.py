"""Offloaded steps: full-attention KV larger than the device tier, staged for each step.

With `EngineConfig.kv_offload_tokens`, a sequence may keep some of its full-attention blocks in
host memory while it runs (wicore.blocks.block_pool, `offload`). A graph reads one buffer per layer,
so a graph run over such rows gives each full-attention layer a *stage*: a buffer on the layer's
device that the run fills with its rows' blocks, row after row, just before the partition runs,
and whose newly written tokens go back to their blocks' homes right after:

    stage frame   0      1 .. n                       n + 1 .. n + m
                  sink   the rows' blocks on DEVICE    their blocks in HOST memory, by frame   (each row's
                                                                                    table lists its frames)
    before a partition, each of its full layers:   stage[:n + 1] = Gather(pool, DEVICE frames)  (on the device)
                                                   stage[n + 1:] = HOST blocks  (copied in, in pieces)
    after it:     the blocks the run wrote         stage ──► their DEVICE or HOST frame (block copies)

The full-attention layers of different partitions run one after another, so they share stages:
one per full layer of a partition (`wicore-export --partitions`, ideally one such layer each).
The device then holds one layer's stage where it would hold every layer's blocks of the long
sequences; the price is copying their host blocks in at every step (and the device ones once
more on the device). Every token is still attended: the tokens are HF's, only slower.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from onnx import helper

from wicore.blocks.tier import Tier
from wicore.devices.device_alloc import buffer_pair
from wicore.devices.micrographs import take_graph
from wicore.devices.pinned import host_allocator
from wicore.devices.providers import Device, onnxruntime, session_options
from wicore.graph.io import SINK_BLOCK
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import KVBuffers
from wicore.kv.device_store import BlockCopier
from wicore.kv.tiers import HostStore
from wicore.types.step import ScheduledRow

GATHER_THREADS = 8  # host threads that gather scattered host blocks for a stage (at most)
GATHER_PART_BYTES = 16 << 20  # the least each of them copies


@dataclass(frozen=True)
class StagePlan:
    """One graph run's staging, integers only: the rows with their full-attention tables made stage
    frames, the blocks to gather (frames 0 .. n - 1 of the stage: the sink, then the rows' DEVICE
    blocks) and to copy in (frames n .. n + m - 1: their HOST blocks), and where the blocks the run
    writes go back."""

    rows: list[ScheduledRow]
    device_src: np.ndarray  # DEVICE frames gathered into stage frames 0 .. n - 1 (the sink first)
    host_src: np.ndarray  # HOST frames copied into stage frames n .. n + m - 1
    back_device_src: np.ndarray  # stage frames the run writes whose block lies on DEVICE ...
    back_device_dst: np.ndarray  # ... at these frames
    back_host_src: np.ndarray  # the same for blocks on HOST
    back_host_dst: np.ndarray

    @property
    def num_frames(self) -> int:
        return len(self.device_src) + len(self.host_src)


def plan_stage(rows: Sequence[ScheduledRow], block_size: int, num_frames: int, has_window: bool) -> StagePlan:
    """Lay `rows` out in a stage of `num_frames` frames (frame 0 is the sink, as in a pool). A row
    with `full_locations` is offloaded; the others' blocks are all on DEVICE (`block_table`). A model
    without sliding layers reads its full table as the window table too: that one becomes the
    stage frames as well."""
    located = [row.full_locations or tuple((Tier.DEVICE, f) for f in row.block_table) for row in rows]
    if any(t not in (Tier.DEVICE, Tier.HOST) for locs in located for t, _ in locs):
        raise ValueError("a block in NVME cannot be staged (the pool lifts it first)")
    # One stage frame per distinct block (rows may share a prefix): the sink, the DEVICE blocks as
    # met, then the HOST blocks by frame, so that consecutive host frames copy in as one slice.
    device = list(dict.fromkeys([SINK_BLOCK] + [f for locs in located for t, f in locs if t is Tier.DEVICE]))
    host = sorted({f for locs in located for t, f in locs if t is Tier.HOST})
    if len(device) + len(host) > num_frames:
        raise ValueError(
            f"the rows stage {len(device) + len(host) - 1} blocks, the stage holds {num_frames - 1} (the scheduler keeps steps within)"
        )
    stage_frame = {
        Tier.DEVICE: {f: i for i, f in enumerate(device)},
        Tier.HOST: {f: len(device) + i for i, f in enumerate(host)},
    }
    out: list[ScheduledRow] = []
    back: dict[Tier, list[tuple[int, int]]] = {Tier.DEVICE: [], Tier.HOST: []}
    for row, locs in zip(rows, located):
        frames = [stage_frame[tier][frame] for tier, frame in locs]
        last = (row.start + len(row.token_ids) - 1) // block_size
        for j in range(row.start // block_size, min(last + 1, len(locs))):
            back[locs[j][0]].append((frames[j], locs[j][1]))
        window = {} if has_window else {"window_table": frames, "window_first": 0}
        out.append(dataclasses.replace(row, block_table=frames, full_locations=(), **window))  # type: ignore[arg-type]
    a = {t: np.asarray(pairs, np.int64).reshape(-1, 2) for t, pairs in back.items()}
    return StagePlan(
        out,
        np.asarray(device, np.int64),
        np.asarray(host, np.int64),
        a[Tier.DEVICE][:, 0],
        a[Tier.DEVICE][:, 1],
        a[Tier.HOST][:, 0],
        a[Tier.HOST][:, 1],
    )


def num_stages(manifest: Manifest) -> int:
    """Stages a model offloads with: the most full-attention layers one partition holds (one device)."""
    cfg = manifest.config
    return max(sum(not cfg.is_sliding(i) for i in range(p.start, p.stop)) for p in manifest.partitions)


@dataclass
class OffloadStats:
    """Blocks staged and written back, counted per full-attention layer."""

    num_runs: int = 0  # graph runs that staged
    num_device_blocks: int = 0  # staged from the device tier (a copy on the device)
    num_host_blocks: int = 0  # staged from host memory (a copy in)
    num_written_back: int = 0


@dataclass
class _Buffers:
    """A (key, value) pair of buffers: their OrtValues, and their NumPy arrays on a CPU device."""

    values: tuple[Any, Any]
    arrays: tuple[np.ndarray, np.ndarray] | None


class KVOffloader:
    """The stages of one model and the copies in and out of them (see the module docstring)."""

    def __init__(
        self,
        manifest: Manifest,
        buffers: KVBuffers,
        host: HostStore,
        num_frames: int,
        num_threads: int | None = 1,
        copy_with_graphs: bool = False,  # copy with the accelerators' graphs even on a CPU (tests)
    ) -> None:
        cfg = manifest.config
        self.num_frames = num_frames
        self.buffers = buffers
        self.host = host
        self.stats = OffloadStats()
        full = [i for i in range(cfg.num_layers) if not cfg.is_sliding(i)]
        self.has_window = len(full) < cfg.num_layers
        self._group_index = {layer: k for k, layer in enumerate(full)}  # the layer in the host store's blocks
        self._layers = [[i for i in range(p.start, p.stop) if i in self._group_index] for p in manifest.partitions]
        self._stages: dict[int, _Buffers] = {}  # full layer -> its stage (shared across partitions)
        by_slot: dict[tuple[str, int], _Buffers] = {}
        self._graphs: dict[str, tuple[Any, BlockCopier]] = {}  # device label -> take session, copier (accelerators)
        self._numpy = not copy_with_graphs
        self._allocate = host_allocator(buffers.layer_devices)  # as the host tier: page-locked for CUDA
        self._gathered: tuple[np.ndarray, np.ndarray] | None = None  # _host_input's room
        self._gather_threads = min(GATHER_THREADS, os.cpu_count() or 1)
        self._threads: ThreadPoolExecutor | None = None
        for layers in self._layers:
            for slot, layer in enumerate(layers):
                device = buffers.layer_devices[layer]
                key = (device.label, slot)
                if key not in by_slot:
                    by_slot[key] = self._new_stage(device)
                self._stages[layer] = by_slot[key]
                if (by_slot[key].arrays is None or copy_with_graphs) and device.label not in self._graphs:
                    self._graphs[device.label] = self._new_graphs(device, num_threads)
        self.num_stages = len(by_slot)

    def _new_stage(self, device: Device) -> _Buffers:
        return _Buffers(*buffer_pair(device, (self.num_frames, *self.buffers.block_shape), self.buffers.dtype))

    def _new_graphs(self, device: Device, num_threads: int | None) -> tuple[Any, BlockCopier]:
        ort = onnxruntime()
        model = take_graph(helper.np_dtype_to_tensor_dtype(self.buffers.dtype), self.buffers.block_shape)
        session = ort.InferenceSession(
            model.SerializeToString(), sess_options=session_options(num_threads, devices=[device]), providers=device.providers()
        )
        return session, BlockCopier(device, self.buffers.dtype, self.buffers.block_shape, num_threads)

    def run(self, rows: Sequence[ScheduledRow], block_size: int) -> StagedRun:
        """A graph run over `rows` (one of them offloaded), staged: its plan's rows are what to batch."""
        self.stats.num_runs += 1
        return StagedRun(self, plan_stage(rows, block_size, self.num_frames, self.has_window))

    def stage(self, partition: int, plan: StagePlan) -> None:
        """Fill the stages of the partition's full layers with the plan's blocks."""
        n, m = len(plan.device_src), len(plan.host_src)
        for layer in self._layers[partition]:
            stage, pool = self._stages[layer], self._pool(layer)
            host = self.host.layer(self._group_index[layer])
            if self._numpy and stage.arrays is not None and pool.arrays is not None:
                for j in range(2):
                    np.take(pool.arrays[j], plan.device_src, axis=0, out=stage.arrays[j][:n], mode="clip")
                    np.take(host[j], plan.host_src, axis=0, out=stage.arrays[j][n : n + m], mode="clip")
            else:
                self._stage_on_device(layer, pool, plan, host, stage)
            self.stats.num_device_blocks += n - 1
            self.stats.num_host_blocks += m

    def _stage_on_device(
        self, layer: int, pool: _Buffers, plan: StagePlan, host: tuple[np.ndarray, np.ndarray], stage: _Buffers
    ) -> None:
        """The device blocks gathered straight into the stage's first frames (one run), the host ones
        copied in after them in pieces (BlockCopier.from_host): no device buffer as large as the stage."""
        device = self.buffers.layer_devices[layer]
        kind, index = device.ort_device
        take, copier = self._graphs[device.label]
        binding = take.io_binding()
        binding.bind_cpu_input("frames", plan.device_src)
        n = len(plan.device_src)
        for j, kv in enumerate("kv"):
            binding.bind_ortvalue_input(kv, pool.values[j])
            binding.bind_output(
                f"{kv}_out", kind, index, self.buffers.dtype, [n, *self.buffers.block_shape], stage.values[j].data_ptr()
            )
        take.run_with_iobinding(binding)
        if len(plan.host_src):
            keys, values = (self._host_input(host[j], j, plan.host_src) for j in range(2))
            copier.from_host(keys, values, stage.values, n)

    def _host_input(self, blocks: np.ndarray, j: int, frames: np.ndarray) -> np.ndarray:
        """blocks[frames] (keys j = 0, values 1) in host memory the device copies from at the bus's speed:
        consecutive frames as they lie in the host tier, others gathered into room allocated as the
        tier is (page-locked for CUDA; made once, as large as a stage)."""
        m = len(frames)
        if not m or int(frames[-1] - frames[0]) == m - 1:
            return blocks[frames[0] : frames[0] + m] if m else blocks[:0]
        if self._gathered is None:
            shape = (self.num_frames, *self.buffers.block_shape)
            self._gathered = (self._allocate(shape, self.buffers.dtype), self._allocate(shape, self.buffers.dtype))
        out = self._gathered[j][:m]
        # NumPy's take lets go of the GIL: a large gather runs in parts at the memory's speed, not one core's.
        parts = max(1, min(self._gather_threads, out.nbytes // GATHER_PART_BYTES))
        if parts == 1:
            _take(blocks, frames, out, 0, m)
            return out
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self._gather_threads, thread_name_prefix="wicore-stage")
        bounds = [m * i // parts for i in range(parts + 1)]
        list(self._threads.map(partial(_take, blocks, frames, out), bounds, bounds[1:]))
        return out

    def unstage(self, partition: int, plan: StagePlan) -> None:
        """Copy the blocks the run wrote from the partition's stages back to where they lie."""
        for layer in self._layers[partition]:
            stage, pool = self._stages[layer], self._pool(layer)
            host = self.host.layer(self._group_index[layer])
            if self._numpy and stage.arrays is not None and pool.arrays is not None:
                for j in range(2):
                    pool.arrays[j][plan.back_device_dst] = stage.arrays[j][plan.back_device_src]
                    host[j][plan.back_host_dst] = stage.arrays[j][plan.back_host_src]
            else:
                copier = self._graphs[self.buffers.layer_devices[layer].label][1]
                copier.copy(stage.values, plan.back_device_src.tolist(), pool.values, plan.back_device_dst.tolist())
                if len(plan.back_host_src):
                    blocks = copier.to_host(stage.values, plan.back_host_src.tolist())
                    host[0][plan.back_host_dst], host[1][plan.back_host_dst] = blocks[:, 0], blocks[:, 1]
            self.stats.num_written_back += len(plan.back_device_src) + len(plan.back_host_src)

    def values(self, layer: int) -> tuple[Any, Any] | None:
        """The stage a full layer reads in a staged run; None for a sliding layer (its own pool)."""
        stage = self._stages.get(layer)
        return None if stage is None else stage.values

    def _pool(self, layer: int) -> _Buffers:
        return _Buffers(self.buffers.values(layer), self.buffers.arrays(layer))


def _take(blocks: np.ndarray, frames: np.ndarray, out: np.ndarray, start: int, stop: int) -> None:
    np.take(blocks, frames[start:stop], axis=0, out=out[start:stop], mode="clip")


class StagedRun:
    """One graph run over staged rows: ModelGraphs.run calls `before` and `after` around each
    partition and binds `values(layer)`, where not None, as the layer's KV buffers."""

    def __init__(self, offloader: KVOffloader, plan: StagePlan) -> None:
        self.offloader = offloader
        self.plan = plan

    def before(self, partition: int) -> None:
        self.offloader.stage(partition, self.plan)

    def after(self, partition: int) -> None:
        self.offloader.unstage(partition, self.plan)

    def values(self, layer: int) -> tuple[Any, Any] | None:
        return self.offloader.values(layer)
