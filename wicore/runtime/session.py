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
from wicore.runtime.providers import onnxruntime, session_options


@dataclass(frozen=True)
class StepBatch:
    """One step: `batch` rows of `seq` token slots each (see wicore.graph.io for each array)."""

    input_ids: np.ndarray  # [batch, seq] int64
    positions: np.ndarray  # [batch, seq] int64
    slot_mapping: np.ndarray  # [batch, seq] int64
    block_tables: np.ndarray  # [batch, max_blocks] int64
    context_lens: np.ndarray  # [batch] int64
    logits_indices: np.ndarray  # [num_logits] int64, flat into batch * seq

    def paging_inputs(self) -> dict[str, np.ndarray]:
        return {
            io.POSITIONS: self.positions,
            io.SLOT_MAPPING: self.slot_mapping,
            io.BLOCK_TABLES: self.block_tables,
            io.CONTEXT_LENS: self.context_lens,
        }


class StepRow(Protocol):
    """One row of a step: run `token_ids` (positions start, start + 1, ...) of a sequence whose
    blocks, in order, are the DEVICE slots `block_table`."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    needs_logits: bool


def build_step(rows: Sequence[StepRow], block_size: int, all_logits: bool = False) -> StepBatch:
    """Step arrays for `rows`. Rows shorter than the longest are padded: their extra
    slots write to the sink block at position 0 and are never read. Logits are asked
    for the last token of each row with `needs_logits` (for every token if all_logits).
    """
    seq_len = max(len(r.token_ids) for r in rows)
    batch = len(rows)
    max_blocks = max(len(r.block_table) for r in rows)
    input_ids = np.zeros((batch, seq_len), np.int64)
    positions = np.zeros((batch, seq_len), np.int64)
    slots = np.full((batch, seq_len), io.SINK_BLOCK * block_size, np.int64)
    tables = np.full((batch, max_blocks), io.SINK_BLOCK, np.int64)
    lens = np.zeros(batch, np.int64)
    logits_indices: list[int] = []
    for r, row in enumerate(rows):
        n = len(row.token_ids)
        end = row.start + n
        blocks = np.asarray(row.block_table, np.int64)
        if len(blocks) * block_size < end:
            raise ValueError(f"a row of {end} tokens has only {len(blocks)} blocks of {block_size}")
        pos = np.arange(row.start, end)
        input_ids[r, :n] = row.token_ids
        positions[r, :n] = pos
        slots[r, :n] = blocks[pos // block_size] * block_size + pos % block_size
        tables[r, : len(blocks)] = blocks
        lens[r] = end
        if all_logits:
            logits_indices.extend(r * seq_len + np.arange(n))
        elif row.needs_logits:
            logits_indices.append(r * seq_len + n - 1)
    return StepBatch(input_ids, positions, slots, tables, lens, np.asarray(logits_indices, np.int64))


@dataclass(frozen=True)
class StepResult:
    logits: np.ndarray  # [num_logits, vocab] float32
    attention_mass: np.ndarray | None  # [batch, max_blocks], when the model was exported with it


@dataclass(frozen=True)
class CacheConfig:
    num_blocks: int
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (one is the padding sink)")
        if self.block_size < 1:
            raise ValueError("block_size must be positive")


class ModelRunner:
    """One ONNX Runtime session per partition, and the per-layer KV pools."""

    def __init__(self, model_dir: Path, manifest: Manifest, cache: CacheConfig, num_threads: int | None = None) -> None:
        ort = onnxruntime()
        self.manifest = manifest
        opts = session_options(num_threads)
        self.sessions = [
            ort.InferenceSession(str(Path(model_dir) / p.file), sess_options=opts, providers=["CPUExecutionProvider"])
            for p in manifest.partitions
        ]
        self.resize(cache)

    def resize(self, cache: CacheConfig) -> None:
        """(Re)allocate the pools for `cache`; their previous contents are dropped."""
        ort = onnxruntime()
        cfg = self.manifest.config
        shape = (cache.num_blocks, cache.block_size, cfg.num_kv_heads, cfg.head_dim)
        dtype = np.dtype(self.manifest.kv_dtype)
        self.cache = cache
        self.key_pools = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self.value_pools = [np.zeros(shape, dtype) for _ in range(cfg.num_layers)]
        self._pool_values = [
            (ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
            for k, v in zip(self.key_pools, self.value_pools)
        ]

    @property
    def vocab_size(self) -> int:
        return self.manifest.config.vocab_size

    def run(self, step: StepBatch) -> StepResult:
        """Run every partition for one step."""
        hidden = None
        mass = None
        for record, session in zip(self.manifest.partitions, self.sessions):
            binding = session.io_binding()
            # The step's result is bound first, so it is get_outputs()[0].
            if record.has_lm_head:
                binding.bind_output(io.LOGITS, "cpu")
            else:
                binding.bind_output(io.HIDDEN_STATES_OUT, "cpu")
            if record.has_embedding:
                binding.bind_cpu_input(io.INPUT_IDS, step.input_ids)
            else:
                binding.bind_ortvalue_input(io.HIDDEN_STATES, hidden)
            for name, array in step.paging_inputs().items():
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
