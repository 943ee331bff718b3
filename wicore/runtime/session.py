"""Runs one decoder step through the partitions with IOBinding, KV pools bound in place.

The pools are NumPy arrays owned here and bound zero-copy: each layer's
`key_cache.{i}` input and `key_cache_out.{i}` output are the same OrtValue, so
the graph's ScatterND writes the new tokens straight into them and no step
allocates or copies a pool. Hidden states pass from one partition to the next
as OrtValues, without a trip through NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.runtime.providers import Device, onnxruntime, parse_device, session_options


@dataclass(frozen=True)
class StepBatch:
    """One step: `batch` rows of `seq` token slots each (see wicore.graph.io for each array)."""

    input_ids: np.ndarray  # [batch, seq] int64
    positions: np.ndarray  # [batch, seq] int64
    slot_mapping: np.ndarray  # [batch, seq] int64
    block_tables: np.ndarray  # [batch, max_blocks] int64
    context_lens: np.ndarray  # [batch] int64
    logits_indices: np.ndarray  # [num_logits] int64, flat into batch * seq
    window_slot_mapping: np.ndarray  # [batch, seq] int64, the sliding layers' block group
    window_block_tables: np.ndarray  # [batch, max_window_blocks] int64
    window_first_block: np.ndarray  # [batch] int64

    def paging_inputs(self) -> dict[str, np.ndarray]:
        return {
            io.POSITIONS: self.positions,
            io.SLOT_MAPPING: self.slot_mapping,
            io.BLOCK_TABLES: self.block_tables,
            io.CONTEXT_LENS: self.context_lens,
            io.WINDOW_SLOT_MAPPING: self.window_slot_mapping,
            io.WINDOW_BLOCK_TABLES: self.window_block_tables,
            io.WINDOW_FIRST_BLOCK: self.window_first_block,
        }


class StepRow(Protocol):
    """One row of a step: run `token_ids` (positions start, start + 1, ...) of a sequence whose
    blocks, in order, are the DEVICE slots `block_table`. Its sliding layers' blocks are
    `window_table`, the first of them holding logical block `window_first` (the blocks before
    it fell out of the window and were released)."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    window_table: Sequence[int]
    window_first: int
    needs_logits: bool


def build_step(rows: Sequence[StepRow], block_size: int, all_logits: bool = False) -> StepBatch:
    """Step arrays for `rows`. Rows shorter than the longest are padded: their extra
    slots write to the sink block at position 0 and are never read. Logits are asked
    for the last token of each row with `needs_logits` (for every token if all_logits).
    """
    seq_len = max(len(r.token_ids) for r in rows)
    batch = len(rows)
    input_ids = np.zeros((batch, seq_len), np.int64)
    positions = np.zeros((batch, seq_len), np.int64)
    lens = np.zeros(batch, np.int64)
    first = np.zeros(batch, np.int64)
    slots, tables = _paging_arrays(batch, seq_len, max(len(r.block_table) for r in rows), block_size)
    window_slots, window_tables = _paging_arrays(batch, seq_len, max(len(r.window_table) for r in rows), block_size)
    logits_indices: list[int] = []
    for r, row in enumerate(rows):
        n = len(row.token_ids)
        end = row.start + n
        pos = np.arange(row.start, end)
        input_ids[r, :n] = row.token_ids
        positions[r, :n] = pos
        _place(row.block_table, 0, pos, slots[r], tables[r], block_size)
        _place(row.window_table, row.window_first, pos, window_slots[r], window_tables[r], block_size)
        lens[r] = end
        first[r] = row.window_first
        if all_logits:
            logits_indices.extend(r * seq_len + np.arange(n))
        elif row.needs_logits:
            logits_indices.append(r * seq_len + n - 1)
    return StepBatch(
        input_ids, positions, slots, tables, lens, np.asarray(logits_indices, np.int64),
        window_slots, window_tables, first,
    )


def _paging_arrays(batch: int, seq_len: int, max_blocks: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Slot mapping and block tables filled with the sink block (where padding goes)."""
    slots = np.full((batch, seq_len), io.SINK_BLOCK * block_size, np.int64)
    tables = np.full((batch, max(max_blocks, 1)), io.SINK_BLOCK, np.int64)
    return slots, tables


def _place(table: Sequence[int], first: int, pos: np.ndarray, slots: np.ndarray, tables: np.ndarray, block_size: int) -> None:
    """Fill one row's slots (for positions `pos`) and table from its blocks, the first of
    which holds logical block `first`."""
    blocks = np.asarray(table, np.int64)
    index = pos // block_size - first
    if len(pos) and (index[0] < 0 or index[-1] >= len(blocks)):
        raise ValueError(
            f"positions {pos[0]}..{pos[-1]} need logical blocks {pos[0] // block_size}..{pos[-1] // block_size}; "
            f"the row has blocks {first}..{first + len(blocks) - 1} of {block_size}"
        )
    slots[: len(pos)] = blocks[index] * block_size + pos % block_size
    tables[: len(blocks)] = blocks


@dataclass(frozen=True)
class StepResult:
    logits: np.ndarray  # [num_logits, vocab] float32
    attention_mass: np.ndarray | None  # [batch, max_blocks], when the model was exported with it


@dataclass(frozen=True)
class CacheConfig:
    """Blocks of the full-attention layers' pools and of the sliding layers' (by default as many)."""

    num_blocks: int
    block_size: int = 16
    num_window_blocks: int | None = None

    def __post_init__(self) -> None:
        if min(self.num_blocks, self.window_blocks) < 2:
            raise ValueError("a KV pool needs at least 2 blocks (one is the padding sink)")
        if self.block_size < 1:
            raise ValueError("block_size must be positive")

    @property
    def window_blocks(self) -> int:
        return self.num_blocks if self.num_window_blocks is None else self.num_window_blocks


class ModelRunner:
    """One ONNX Runtime session per partition, each on its device, and the per-layer KV pools.

    A layer's pools live on the device of the partition that runs it. Pools of CPU-allocated
    devices are NumPy arrays (`key_pools[i]`), bound zero-copy; device-allocated pools exist
    only as OrtValues (`key_pools[i]` is None) and are zero-filled once at allocation, since
    masked-out slots must hold finite values (0 x NaN is NaN).
    """

    def __init__(
        self,
        model_dir: Path,
        manifest: Manifest,
        cache: CacheConfig,
        num_threads: int | None = None,
        devices: Sequence[Device] | None = None,
        profile_prefix: str | None = None,  # ONNX Runtime's profiler on (tools/profile_step.py)
    ) -> None:
        ort = onnxruntime()
        self.manifest = manifest
        self.devices = list(devices) if devices is not None else [parse_device("cpu")] * len(manifest.partitions)
        if len(self.devices) != len(manifest.partitions):
            raise ValueError(f"{len(self.devices)} devices for {len(manifest.partitions)} partitions")
        for device in self.devices:
            device.check_can_run(manifest.dtype, manifest.op_flavour)
        opts = session_options(num_threads, profile_prefix)
        self.sessions = [
            ort.InferenceSession(str(Path(model_dir) / p.file), sess_options=opts, providers=d.providers())
            for p, d in zip(manifest.partitions, self.devices)
        ]
        self._input_names = [{i.name for i in s.get_inputs()} for s in self.sessions]
        self.resize(cache)

    def resize(self, cache: CacheConfig) -> None:
        """(Re)allocate the pools for `cache`; their previous contents are dropped."""
        ort = onnxruntime()
        cfg = self.manifest.config
        dtype = np.dtype(self.manifest.kv_dtype)
        self.cache = cache
        self.key_pools: list[np.ndarray | None] = []
        self.value_pools: list[np.ndarray | None] = []
        self._pool_values = []
        for record, device in zip(self.manifest.partitions, self.devices):
            kind, index = device.ort_device
            for layer in range(record.start, record.stop):
                num_blocks = cache.window_blocks if cfg.is_sliding(layer) else cache.num_blocks
                shape = (num_blocks, cache.block_size, cfg.num_kv_heads, cfg.head_dim)
                pair = []
                for pools in (self.key_pools, self.value_pools):
                    host = np.zeros(shape, dtype)
                    pools.append(host if kind == "cpu" else None)
                    pair.append(ort.OrtValue.ortvalue_from_numpy(host, kind, index))
                self._pool_values.append(tuple(pair))

    @property
    def pools_on_host(self) -> bool:
        """Whether every pool is a NumPy array (paged by NumPy slices; otherwise by OrtPoolStore's graphs)."""
        return all(p is not None for p in self.key_pools)

    @property
    def pool_values(self) -> list[tuple[object, object]]:
        """Each layer's bound (key, value) pool OrtValues; replaced by `resize`."""
        return list(self._pool_values)

    @property
    def layer_devices(self) -> list[Device]:
        """The device of each layer's partition (where its pools live)."""
        return [d for p, d in zip(self.manifest.partitions, self.devices) for _ in range(p.start, p.stop)]

    def _handoff_device(self, partition: int) -> tuple[str, int]:
        """Where partition `partition` writes its hidden states: the next partition's device if
        that is host memory or its own device, else its own device."""
        own, nxt = self.devices[partition].ort_device, self.devices[partition + 1].ort_device
        return nxt if nxt[0] == "cpu" or nxt == own else own

    @property
    def vocab_size(self) -> int:
        return self.manifest.config.vocab_size

    def run(self, step: StepBatch) -> StepResult:
        """Run every partition for one step."""
        hidden = None
        mass = None
        parts = list(zip(self.manifest.partitions, self.sessions))
        for i, (record, session) in enumerate(parts):
            binding = session.io_binding()
            # The step's result is bound first, so it is get_outputs()[0]. Hidden states go
            # straight to the next partition's device when this session can write there (its
            # own device, or host memory); between two accelerators they pass through the host,
            # since a session has no allocator for another card.
            if record.has_lm_head:
                binding.bind_output(io.LOGITS, "cpu")
            else:
                binding.bind_output(io.HIDDEN_STATES_OUT, *self._handoff_device(i))
            if record.has_embedding:
                binding.bind_cpu_input(io.INPUT_IDS, step.input_ids)
            elif self._handoff_device(i - 1) == self.devices[i].ort_device:
                binding.bind_ortvalue_input(io.HIDDEN_STATES, hidden)
            else:
                binding.bind_cpu_input(io.HIDDEN_STATES, hidden.numpy())
            for name, array in step.paging_inputs().items():
                if name in self._input_names[i]:
                    binding.bind_cpu_input(name, array)
            for layer in range(record.start, record.stop):
                key, value = self._pool_values[layer]
                binding.bind_ortvalue_input(io.key_cache(layer), key)
                binding.bind_ortvalue_output(io.key_cache_out(layer), key)
                binding.bind_ortvalue_input(io.value_cache(layer), value)
                binding.bind_ortvalue_output(io.value_cache_out(layer), value)
            if record.has_lm_head:
                binding.bind_cpu_input(io.LOGITS_INDICES, step.logits_indices)
            if record.has_attention_stats:
                binding.bind_output(io.ATTENTION_MASS, "cpu")
            session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
            hidden = outputs[0]
            if record.has_attention_stats:
                part = outputs[-1].numpy()
                mass = part if mass is None else mass + part
        return StepResult(hidden.numpy(), mass)
