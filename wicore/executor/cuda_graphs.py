"""Decode steps replayed from CUDA graphs that ONNX Runtime captures (CUDA EP, paged attention).

At batch 1 a decode step of the 27B shape spends more time dispatching ~60 ONNX Runtime kernels
a layer than reading the weights (docs/PERFORMANCE.md). ONNX Runtime's CUDA EP can capture a
session's run into a CUDA graph and replay it (`enable_cuda_graph`), as vLLM does with its
decode steps, provided that every input and output of the run stays at one device address with
one shape. So each batch-size bucket (1, 2, 4, 8, ... rows) gets its own inputs, allocated
once on the device and refilled in place each step, and its own graph id:

    rows ──► padded to the bucket ──► copied into the bucket's device inputs ──► replay ──► greedy tokens, draws
             (extra rows: one token at position 0 in the sink block; their tokens are dropped)

The block tables have a fixed width too (the most blocks a sequence can hold), and the paged
attention's host-side bounds are the largest the step can see, so the kernels chosen at capture
stay valid as sequences grow. Every decode step runs this way: the greedy tokens come back to
the host, the sampling head's draws when a row samples there, and the [rows, vocab] logits only
when a row needs them (they are written into the bucket's device buffer either way). Prefill chunks and image prompts run uncaptured (graph id -1).

A bucket's per-step inputs are views into one host buffer allocated with it (StepInputs): a step
writes the batch into them and copies the whole buffer to the device in one transfer, where each
input was its own copy (and its own padded array) before: nothing is allocated on the way.

Partitions on several CUDA devices (the model split over two cards) each capture their own graphs and
replay them on their own card; the hidden states cross between cards by wicore.executor.card_handoff.

With steps in flight over groups of requests (wicore.engine.groups), a bucket has one slot a group
(its own inputs, hidden-state and output buffers, and graph ids), each calling thread keeps the
slot it first took (a group's step runs, and reads its outputs, on one thread), and the partitions'
replays go through the pipeline's workers, so while cuda:1 replays group A's step cuda:0 replays
B's. Every such graph is captured when the graphs are enabled, one after another (ONNX Runtime
captures in CUDA's global mode, in which another thread's copy or allocation fails), on padding rows
that look like decode rows with a past, and on the workers that will replay it: the CUDA EP keeps
its graphs per thread (its PerThreadContext), so a graph captured on another thread is not found
there, and the worker would capture its own while the other worker and the groups' threads copy
(the "capture invalidated" and cuDNN "invalid device context" failures of the first runs). The
partitions' sessions then keep an arena of their own (wicore.executor.graphs): a graph replays into
the scratch it was captured with, which a shared arena counts as free between runs and could hand
to the handoff's copy or the sampling head on another thread while that replay runs (seen on two
H200s: one step in eight handed on other hidden states). One slot is captured as on one card: on
the first real decode step of each bucket, on the thread that runs every step.

On two H200s (tools/check_split_graphs_gpu.py, 2026-11-28 18:00 UTC) whole steps with the handoff
bound each step give the uncaptured split's logits; groups in flight with the fixes after that run
(tools/bench_pipeline_gpu.py, 18:23 UTC) gave every request the uncaptured split's tokens, 1.99x its
output at 32 streams.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wicore.executor.batch import BatchInputs
from wicore.executor.card_handoff import HANDOFFS, card_handoff, handoff_session
from wicore.executor.device_wait import device_waiter
from wicore.executor.graph_io import GraphOutputs, SamplingInputs, graph_outputs
from wicore.executor.step_inputs import Place, StepInputs
from wicore.graph import io

_HOST = (io.ATTENTION_BOUNDS, io.WINDOW_ATTENTION_BOUNDS)  # read by the op on the host, at capture
CAPTURE_RUNS = 3  # runs of a graph id when captured up front: ONNX Runtime captures after a regular run or two


def buckets(max_rows: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two that holds `max_rows`."""
    out = [1]
    while out[-1] < max_rows:
        out.append(out[-1] * 2)
    return out


@dataclass
class _Bucket:
    rows: int
    graph_id: int
    inputs: StepInputs
    bindings: list[object]  # one IOBinding a partition, bound once
    handoffs: list[Callable[[], None] | None]  # after partition i: what copies its hidden states to the next card, or None
    written: list[object]  # partition i's hidden states, on its device
    read: list[object]  # partition i + 1's hidden-state input, on its device (written[i] itself on one device)
    outputs: dict[str, object]  # the last partition's: name -> OrtValue on its device (greedy, logits, draws)


class DecodeGraphs:
    """Captured decode steps of a ModelGraphs whose partitions run on CUDA devices (one or several),
    `num_slots` steps at once (one a group of requests in flight)."""

    def __init__(
        self,
        graphs,
        block_size: int,
        max_rows: int,
        max_blocks: int,
        max_window_blocks: int,
        max_context: int,
        num_slots: int = 1,
        handoff: str = "device",
    ) -> None:
        from wicore.devices.providers import onnxruntime

        self._ort = onnxruntime()
        # The graphs own this object: a strong reference back would make the pair a cycle that only
        # the garbage collector frees, and an engine dropped in a loop (the benchmarks) would keep
        # its sessions' device memory until then (seen on an H100: out of memory at the 7th engine).
        self.graphs = weakref.proxy(graphs)
        self.sink_slot = io.SINK_BLOCK * block_size  # offset 0 of the sink block
        self._block_size = block_size
        self.max_blocks = max_blocks
        self.max_window_blocks = max(max_window_blocks, 1)
        self.max_context = max_context
        if num_slots < 1:
            raise ValueError(f"decode graphs need at least 1 slot, got {num_slots}")
        if handoff not in HANDOFFS:
            raise ValueError(f"hidden states are handed between cards through one of {HANDOFFS}, not {handoff!r}")
        self.handoff = handoff
        self.places: list[Place] = [d.ort_device for d in graphs.devices]
        self._wait_device = device_waiter(self.places[-1])  # a replay returns once launched, not run
        self._crossings = [i for i in range(len(self.places) - 1) if self.places[i] != self.places[i + 1]]
        self._handoff_sessions = {i: handoff_session(graphs, i) for i in self._crossings} if handoff == "device" else {}
        sizes = buckets(max_rows)
        self._slots = [[self._bucket(n, slot * len(sizes) + i) for i, n in enumerate(sizes)] for slot in range(num_slots)]
        self._buckets = self._slots[0]
        self._slot_lock = threading.Lock()
        self._slot_of: dict[int, int] = {}  # thread id -> its slot
        if num_slots > 1:  # several steps at once: capture now, while nothing else runs
            self._capture()

    def _bucket(self, rows: int, graph_id: int) -> _Bucket:
        ort, graphs, places = self._ort, self.graphs, self.places
        kind, index = places[-1]
        hidden = graphs.manifest.config.hidden_size
        shapes: dict[str, tuple[tuple[int, ...], type]] = {
            io.INPUT_IDS: ((rows, 1), np.int64),
            io.POSITIONS: ((rows, 1), np.int64),
            io.SLOT_MAPPING: ((rows, 1), np.int64),
            io.BLOCK_TABLES: ((rows, self.max_blocks), np.int64),
            io.WINDOW_SLOT_MAPPING: ((rows, 1), np.int64),
            io.WINDOW_BLOCK_TABLES: ((rows, self.max_window_blocks), np.int64),
            io.CUMULATIVE_SEQLENS: ((rows + 1,), np.int32),
            io.PAST_SEQLENS: ((rows,), np.int32),
            io.WINDOW_PAST_SEQLENS: ((rows,), np.int32),
            io.WINDOW_LOGICAL_TABLES: ((rows, self.max_blocks), np.int64),
            io.LOGITS_INDICES: ((rows,), np.int64),
            # the portable attention's (bound only where a graph takes them: on the CPU EP, in tests)
            io.CONTEXT_LENS: ((rows,), np.int64),
            io.WINDOW_FIRST_BLOCK: ((rows,), np.int64),
        }
        if graphs.inline_head:
            shapes |= {io.SAMPLING_TEMPERATURE: ((rows,), np.float32), io.SAMPLING_UNIFORM: ((rows,), np.float32)}
        taken = set().union(*(graphs.input_names(i) for i in range(len(graphs.sessions))))
        whole = graphs.devices[-1].capability.capture_whole_values
        inputs = StepInputs({name: shape for name, shape in shapes.items() if name in taken}, *places, separate=whole)
        inputs.fix(io.CUMULATIVE_SEQLENS, np.arange(rows + 1, dtype=np.int32), 0)  # one token a row: fixed
        inputs.fix(io.LOGITS_INDICES, np.arange(rows, dtype=np.int64), 0)
        bounds = np.asarray([1, self.max_context], np.int32)
        # the largest bounds: the kernels chosen at capture hold for every replay
        # (on the adapter where the EP binds whole device values: WebGPU's capture takes no host value)
        at = places[-1] if whole else ("cpu", 0)
        host = {name: ort.OrtValue.ortvalue_from_numpy(bounds.copy(), *at) for name in _HOST}
        outputs = {
            name: ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, kind, index)
            for name, (shape, dtype) in self._output_shapes(rows).items()
        }
        # partition i writes its hidden states into written[i] on its device; partition i + 1 reads
        # them from read[i] on its own (the same buffer when both are on one device)
        written = [ort.OrtValue.ortvalue_from_shape_and_type([rows, 1, hidden], np.float32, *p) for p in places[:-1]]
        read = [
            written[i] if i not in self._crossings else ort.OrtValue.ortvalue_from_shape_and_type([rows, 1, hidden], np.float32, *places[i + 1])
            for i in range(len(written))
        ]  # fmt: skip
        handoffs: list[Callable[[], None] | None] = [None] * len(written)
        for i in self._crossings:
            handoffs[i] = card_handoff(self._handoff_sessions.get(i), written[i], read[i])
        bindings = []
        for i, (record, session) in enumerate(zip(graphs.manifest.partitions, graphs.sessions)):
            binding = session.io_binding()
            names = set(graphs.input_names(i))
            inputs.bind(binding, names, places[i])
            for name, value in host.items():
                if name in names:
                    binding.bind_ortvalue_input(name, value)
            if i > 0:
                binding.bind_ortvalue_input(io.HIDDEN_STATES, read[i - 1])
            graphs.bind_kv(binding, record)
            if record.has_lm_head:
                for name, value in outputs.items():
                    binding.bind_ortvalue_output(name, value)
            else:
                binding.bind_ortvalue_output(io.HIDDEN_STATES_OUT, written[i])
            bindings.append(binding)
        return _Bucket(rows, graph_id, inputs, bindings, handoffs, written, read, outputs)

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def _capture(self) -> None:
        """Run every slot's every bucket CAPTURE_RUNS times on padding rows (the sink block), one run
        at a time, each partition's on the thread that will replay it (the pipeline's worker: the CUDA
        EP finds a graph only on the thread that captured it), so that ONNX Runtime captures each
        graph now, while nothing else runs, and replays it after."""
        pipeline = self.graphs.pipeline
        for slot in self._slots:
            for bucket in slot:
                self._write_padding(bucket.inputs)
                for _ in range(CAPTURE_RUNS):
                    stages = self._stages(bucket)
                    if pipeline is not None:
                        pipeline.run_in_order(stages)
                    else:
                        for stage in stages:
                            stage()

    def _slot(self) -> list[_Bucket]:
        """The calling thread's slot: the one it took first. With several steps in flight each runs,
        and reads its outputs, on a thread of its own (wicore.engine.groups)."""
        if len(self._slots) == 1:
            return self._slots[0]
        thread = threading.get_ident()
        with self._slot_lock:
            slot = self._slot_of.get(thread)
            if slot is None:
                if len(self._slot_of) == len(self._slots):
                    raise RuntimeError(f"{len(self._slots)} decode graph slots, all taken by other threads")
                slot = self._slot_of[thread] = len(self._slot_of)
        return self._slots[slot]

    def _stages(self, bucket: _Bucket) -> list[Callable[[], None]]:
        """Each partition's replay of `bucket`, then the copy of its hidden states to the next card."""
        options = self._ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(bucket.graph_id))
        sessions = self.graphs.sessions

        def stage(i: int) -> None:
            sessions[i].run_with_iobinding(bucket.bindings[i], options)
            handoff = bucket.handoffs[i] if i < len(bucket.handoffs) else None
            if handoff is not None:
                handoff()

        return [functools.partial(stage, i) for i in range(len(sessions))]

    def _output_shapes(self, rows: int) -> dict[str, tuple[tuple[int, ...], type]]:
        graphs = self.graphs
        shapes: dict[str, tuple[tuple[int, ...], type]] = {
            io.LOGITS: ((rows, graphs.manifest.config.vocab_size), np.float32),
            io.GREEDY_TOKENS: ((rows,), np.int64),
        }
        if graphs.inline_head:
            k = next(o.shape[-1] for o in graphs.sessions[-1].get_outputs() if o.name == io.TOP_PROBS)
            shapes |= {
                io.SAMPLED_TOKENS: ((rows,), np.int64),
                io.TOP_PROBS: ((rows, k), np.float32),
                io.TOP_IDS: ((rows, k), np.int64),
            }
        return shapes

    def can_run(self, batch: BatchInputs) -> bool:
        rows, seq = batch.input_ids.shape
        return (
            seq == 1
            and rows <= self._buckets[-1].rows
            and max(batch.block_tables.shape[1], batch.window_logical_tables.shape[1]) <= self.max_blocks
            and batch.window_block_tables.shape[1] <= self.max_window_blocks
        )

    def run(self, batch: BatchInputs, logits: bool, sampling: SamplingInputs | None = None) -> GraphOutputs:
        """A decode batch (`can_run`) from a replayed graph: each row's greedy token, with `logits`
        the rows' [rows, vocab] logits, with `sampling` the sampling head's draws."""
        return self.launch(self.prepare(batch, sampling), logits)

    def prepare(self, batch: BatchInputs, sampling: SamplingInputs | None = None) -> Replay:
        """`batch`'s inputs written into its bucket's host buffer, the next side (StepInputs.flip), for
        `launch`: under async scheduling the engine thread prepares a step while the one before runs."""
        rows = batch.input_ids.shape[0]
        bucket = next(b for b in self._slot() if b.rows >= rows)
        bucket.inputs.flip()
        self._write(batch, bucket.inputs, sampling)
        return Replay(bucket, bucket.inputs.host, bucket.inputs.views[io.INPUT_IDS], rows, sampling)

    def launch(self, replay: Replay, logits: bool) -> GraphOutputs:
        """Copy a prepared step's inputs to the device and replay its graphs: the outputs `run` gives."""
        bucket, sampling = replay.bucket, replay.sampling
        bucket.inputs.sync(replay.host)
        stages = self._stages(bucket)
        pipeline = self.graphs.pipeline
        if pipeline is not None and self.num_slots > 1:  # each card replays one group's step while the other replays another's
            pipeline.run_in_order(stages)
        else:
            for stage in stages:
                stage()
        if self._wait_device is not None:  # with the GIL released, not in the first read below
            self._wait_device()
        outputs = dict(bucket.outputs)
        if sampling is not None and self.graphs.head is not None:  # the head runs uncaptured, on the bucket's logits
            outputs |= self.graphs.head.run(bucket.outputs[io.LOGITS], sampling)
        # On the CPU an output's array is a view of the bucket's buffer, which the next step's replay
        # overwrites: under async scheduling that may come before this step's rows are read.
        on_host = self.places[-1][0] == "cpu"
        rows_of = {name: _Rows(value, replay.rows, on_host) for name, value in outputs.items()}
        return graph_outputs(rows_of, logits, sampling is not None, None)

    def _write(self, batch: BatchInputs, inputs: StepInputs, sampling: SamplingInputs | None) -> None:
        """The batch's inputs into the bucket's host side (`launch` copies it): extra rows decode one token at
        position 0 of the sink block, and the tables are padded with the sink to their fixed width.
        Without `sampling`, an export with the sampling head draws at temperature 1 (the draws go
        unread)."""
        sink, sink_slot = io.SINK_BLOCK, self.sink_slot
        inputs.put(io.INPUT_IDS, batch.input_ids, 0)
        inputs.put(io.POSITIONS, batch.positions, 0)
        inputs.put(io.SLOT_MAPPING, batch.slot_mapping, sink_slot)
        inputs.put(io.BLOCK_TABLES, batch.block_tables, sink)
        inputs.put(io.WINDOW_SLOT_MAPPING, batch.window_slot_mapping, sink_slot)
        inputs.put(io.WINDOW_BLOCK_TABLES, batch.window_block_tables, sink)
        inputs.put(io.PAST_SEQLENS, batch.past_seqlens, 0)
        inputs.put(io.WINDOW_PAST_SEQLENS, batch.window_past_seqlens, 0)
        inputs.put(io.WINDOW_LOGICAL_TABLES, batch.window_logical_tables, sink)
        inputs.put(io.CONTEXT_LENS, batch.context_lens, 1)
        inputs.put(io.WINDOW_FIRST_BLOCK, batch.window_first_block, 0)
        if self.graphs.inline_head:
            head = sampling or SamplingInputs.unused(batch.input_ids.shape[0])
            inputs.put(io.SAMPLING_TEMPERATURE, head.temperature, 1)
            inputs.put(io.SAMPLING_UNIFORM, head.uniform, 0)

    def _write_padding(self, inputs: StepInputs) -> None:
        """Rows for an up-front capture, each a decode row of the sink block: its last slot's token after
        block_size - 1 cached ones (a row with a past, as every real decode row has: a capture on rows
        without one may keep a kernel choice that reads none)."""
        sink, past = io.SINK_BLOCK, self._block_size - 1
        for name, fill in (
            (io.INPUT_IDS, 0), (io.POSITIONS, past), (io.SLOT_MAPPING, self.sink_slot + past), (io.BLOCK_TABLES, sink),
            (io.WINDOW_SLOT_MAPPING, self.sink_slot + past), (io.WINDOW_BLOCK_TABLES, sink), (io.PAST_SEQLENS, past),
            (io.WINDOW_PAST_SEQLENS, past), (io.WINDOW_LOGICAL_TABLES, sink), (io.SAMPLING_TEMPERATURE, 1),
            (io.SAMPLING_UNIFORM, 0), (io.CONTEXT_LENS, past + 1), (io.WINDOW_FIRST_BLOCK, 0),
        ):  # fmt: skip
            if name in inputs.shapes:
                inputs.put(name, np.zeros((0,) * len(inputs.shapes[name][0])), fill)
        inputs.sync()


@dataclass(frozen=True)
class Replay:
    """A decode step prepared for a bucket's graphs (`DecodeGraphs.prepare`): the host side its inputs
    were written to, copied to the device by `launch`. `input_ids` is that side's view of the token
    ids ([bucket rows, 1]): a row fed from the step before is written there before the launch."""

    bucket: _Bucket
    host: np.ndarray
    input_ids: np.ndarray
    rows: int
    sampling: SamplingInputs | None


@dataclass(frozen=True)
class _Rows:
    """The first `rows` rows of one of a bucket's device outputs, copied to the host on `numpy()`
    (`copy`: a bucket in host memory, whose `numpy()` is a view of its buffer)."""

    value: object
    rows: int
    copy: bool = False

    def numpy(self) -> np.ndarray:
        rows = self.value.numpy()[: self.rows]  # type: ignore[attr-defined]
        return rows.copy() if self.copy else rows
