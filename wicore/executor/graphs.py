"""Runs one batch through the partitions' ONNX Runtime sessions, KV buffers bound in place.

Each layer's `key_cache.{i}` input and `key_cache_out.{i}` output are bound to the same
OrtValue of wicore.kv.buffers, so the graph's ScatterND writes the new tokens
straight into the buffer and no run allocates or copies one. Hidden states pass from one
partition to the next as OrtValues, without a trip through NumPy when the devices allow.

    BatchInputs ──► part-00 (embed, layers) ──► part-01 ... ──► part-NN (lm head) ──► logits [num_logits, vocab]
                        │ binds key/value buffers of its layers, in place │
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wicore.devices.providers import Device, DeviceError, onnxruntime, session_options
from wicore.executor import pipeline
from wicore.executor.batch import BATCH_FIELDS, BatchInputs
from wicore.executor.card_handoff import HANDOFFS, cudnn_sdpa_off_for_steps_in_flight
from wicore.executor.cuda_graphs import DecodeGraphs, Replay
from wicore.executor.graph_io import GraphOutputs, SamplingInputs, graph_outputs
from wicore.executor.kept_binding import HostTokens, KeptBindings
from wicore.executor.sampling_head import SamplingHead
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.graph.paged_attention import flash_page_size
from wicore.kernels.library import KernelBuildError, has_cuda_kernels, library
from wicore.kv.buffers import KVBuffers
from wicore.kv.offload import StagedRun


def kernel_library(devices: Sequence[Device]) -> Path:
    """WiCore's kernel library for these devices (built once, wicore.kernels.library): with the CUDA
    kernels where a device is a CUDA one (a CPU-only build would run those nodes on the host)."""
    cuda = any(d.ort_device[0] == "cuda" for d in devices)
    path = library(cuda)
    if cuda and not has_cuda_kernels(path):
        raise KernelBuildError(f"{path} holds no CUDA kernels; remove it to rebuild with nvcc")
    return path


SPLIT_GRAPHS_ENV = "WICORE_SPLIT_CUDA_GRAPHS"  # "device" | "host": CUDA graphs over several cards (experimental)


def split_graphs() -> str | None:
    """How hidden states cross between cards in CUDA graphs over several cards (card_handoff.HANDOFFS),
    as the environment says, or None: such graphs only where asked for (`--cuda-graphs on`, then
    "device"), not by default. On two H200s (2026-11-28, docs/PERFORMANCE.md) the split's captured
    decode steps first gave other tokens (the handoff bound once, since fixed); rerun with groups in
    flight: every token equal, 1.99x the sequential split at 32 streams, one run."""
    value = os.environ.get(SPLIT_GRAPHS_ENV, "").strip().lower()
    if value and value not in HANDOFFS:
        raise DeviceError(f"{SPLIT_GRAPHS_ENV}={value}: choose one of {', '.join(HANDOFFS)}, or leave it unset (off)")
    return value or None


def split_handoff(cuda_graphs: bool | None, several: bool) -> str | None:
    """How hidden states cross between cards in captured steps over `several` cards: the environment's
    way (split_graphs), else "device" where graphs are asked for (`cuda_graphs` True, `--cuda-graphs on`);
    None: no graphs over several cards (auto leaves a split uncaptured)."""
    return split_graphs() or ("device" if cuda_graphs and several else None)


def can_capture(manifest: Manifest, devices: Sequence[Device], across_devices: bool = False) -> bool:
    """Decode steps can be captured: a paged-attention export, every partition on one CUDA device, or
    with `across_devices` on CUDA devices (each partition captures its own, wicore.executor.cuda_graphs),
    or on one device of another EP that captures (Capability.graph_capture: WebGPU's)."""
    on_cuda = all(d.capability.name == "cuda" for d in devices)
    on_one = all(d == devices[0] for d in devices)
    if manifest.attention != "paged":
        return False
    return (across_devices or on_one) if on_cuda else on_one and devices[0].capability.graph_capture is not None


class ModelGraphs:
    """One ONNX Runtime session per partition, each on its device, bound to the KV buffers."""

    def __init__(
        self,
        model_dir: Path,
        manifest: Manifest,
        buffers: KVBuffers,
        devices: Sequence[Device],
        num_threads: int | None = None,
        profile_prefix: str | None = None,  # ONNX Runtime's profiler on (tools/profile_step.py)
        cuda_graphs: bool | None = False,  # decode steps captured and replayed (runtime/cuda_graphs.py)
        block_size: int | None = None,  # cuda_graphs None: on where they can be and blocks are FlashAttention's
        micro_batch_tokens: int | None = None,  # wicore.executor.pipeline; None: its default over several devices; 0: off
        pipeline_groups: int | None = 1,  # steps in flight at once (wicore.engine.groups); None: one a device
    ) -> None:
        ort = onnxruntime()
        self.manifest = manifest
        self.buffers = buffers
        self.devices = list(devices)
        if len(self.devices) != len(manifest.partitions):
            raise ValueError(f"{len(self.devices)} devices for {len(manifest.partitions)} partitions")
        for device in self.devices:
            device.check_can_run(manifest.dtype, manifest.op_flavour, manifest.attention)
        several = len({d.ort_device for d in self.devices}) > 1
        if pipeline_groups is None:
            pipeline_groups = len({d.ort_device for d in self.devices}) if several else 1
        # Steps in flight at once: each partition's runs go through its own worker, in the order they come.
        self.pipeline_groups = pipeline_groups if len(self.devices) > 1 else 1
        self.handoff = split_handoff(cuda_graphs, several)
        if cuda_graphs is None:  # greedy and sampled tokens measured identical to uncaptured there (PERFORMANCE.md)
            tile = flash_page_size(manifest.config.head_dim)
            able = can_capture(manifest, self.devices, self.handoff is not None)
            on_cuda = self.devices[0].capability.name == "cuda"  # WebGPU's: only when asked for (--cuda-graphs on)
            cuda_graphs = able and on_cuda and block_size is not None and block_size % tile == 0
        self.cuda_graphs = cuda_graphs
        if cuda_graphs and not can_capture(manifest, self.devices, self.handoff is not None):
            raise DeviceError(
                "captured decode steps (--cuda-graphs on) need an export with --attention paged and every partition "
                "on a cuda device, or on the webgpu device"
            )
        # Steps in flight replay one card's graphs while other threads allocate on it (the handoff's
        # copy, the sampling head): the graphs' scratch, which a shared arena counts as free between
        # runs, must be the partition sessions' own (wicore.executor.cuda_graphs).
        self.replays_in_flight = bool(cuda_graphs) and several and self.pipeline_groups > 1
        if self.replays_in_flight and all(d.capability.name == "cuda" for d in self.devices):
            cudnn_sdpa_off_for_steps_in_flight()
        opts = session_options(num_threads, profile_prefix, self.devices, share_arena=not self.replays_in_flight)
        if cuda_graphs and any(d.capability.capture_whole_values for d in self.devices):
            opts.enable_mem_pattern = False  # the WebGPU EP's capture (Capability.capture_whole_values)
        if manifest.kernels == "wicore":
            opts.register_custom_ops_library(str(kernel_library(self.devices)))
        try:
            self.sessions = [
                ort.InferenceSession(str(Path(model_dir) / p.file), sess_options=opts, providers=d.providers(cuda_graphs))
                for p, d in zip(manifest.partitions, self.devices)
            ]
        except Exception as exc:  # a paged webgpu export from before 2026-11-29 packs its index inputs on the CPU
            if not cuda_graphs or "graph capture" not in str(exc):
                raise
            raise DeviceError(
                f"ONNX Runtime cannot capture this export's graphs: re-export it, or --cuda-graphs off ({exc})"
            ) from exc
        self._input_names = [{i.name for i in s.get_inputs()} for s in self.sessions]
        # each partition's inputs among the batch's arrays, named once: a decode step reads them by name
        # instead of filtering every array of the batch (a tiny model's step is ~1 ms; docs/PERFORMANCE.md)
        self._batch_names = [
            tuple(
                name
                for name in BATCH_FIELDS
                if name in names and (name != io.INPUT_IDS or p.has_embedding) and (name != io.LOGITS_INDICES or p.has_lm_head)
            )
            for names, p in zip(self._input_names, manifest.partitions)
        ]
        self.has_greedy_tokens = io.GREEDY_TOKENS in manifest.partitions[-1].outputs
        self.has_sampling_head = manifest.has_sampling_head
        self.inline_head = manifest.partitions[-1].has_sampling_head  # an older export's head, in its last partition
        self.head = SamplingHead(manifest.config.vocab_size, self.devices[-1], num_threads) if manifest.sampling_head else None
        self.decode_graphs: DecodeGraphs | None = None
        if micro_batch_tokens is None:  # on where the partitions span devices that can work at once
            micro_batch_tokens = pipeline.DEFAULT_TOKENS if several else 0
        in_pipeline = (micro_batch_tokens or self.pipeline_groups > 1) and len(self.sessions) > 1
        self.pipeline = pipeline.Pipeline(self, micro_batch_tokens) if in_pipeline else None
        self.kept = KeptBindings(ort)  # greedy decode steps' bindings on the CPU, kept between steps
        self._listed_kv: dict[int, tuple[KVBuffers, tuple[Any, ...]]] = {}  # _kv_values: partition -> (buffers, values)
        self._run_options = None
        if cuda_graphs:  # a session that captures runs uncaptured only when told so
            self._run_options = ort.RunOptions()
            self._run_options.add_run_config_entry("gpu_graph_id", "-1")

    @property
    def can_mask_in_head(self) -> bool:
        """Whether constrained rows draw in the sampling head: it takes their masks (an older
        export's inline head does not; its constrained rows sample on the host)."""
        return self.head is not None and self.head.has_token_bitmask

    def enable_decode_graphs(
        self, block_size: int, max_rows: int, max_blocks: int, max_window_blocks: int, max_context: int
    ) -> None:
        """Replay greedy decode steps of up to `max_rows` rows from captured CUDA graphs, a set of them
        for each step in flight (`pipeline_groups`)."""
        self.decode_graphs = DecodeGraphs(
            self, block_size, max_rows, max_blocks, max_window_blocks, max_context, self.pipeline_groups, self.handoff or "device"
        )

    def input_names(self, partition: int) -> set[str]:
        return self._input_names[partition]

    def bind_kv(self, binding, record, staged: StagedRun | None = None) -> None:
        """Bind the partition's KV buffers as its cache inputs and, in place, its cache outputs
        (in a staged run, each full-attention layer's stage: wicore.kv.offload)."""
        for layer in range(record.start, record.stop):
            key, value = (staged.values(layer) if staged is not None else None) or self.buffers.values(layer)
            binding.bind_ortvalue_input(io.key_cache(layer), key)
            binding.bind_ortvalue_output(io.key_cache_out(layer), key)
            binding.bind_ortvalue_input(io.value_cache(layer), value)
            binding.bind_ortvalue_output(io.value_cache_out(layer), value)

    def _handoff_device(self, partition: int) -> tuple[str, int]:
        """Where partition `partition` writes its hidden states: the next partition's device if
        that is host memory or its own device, else its own device (a session has no allocator for
        another card), or host memory where graphs replay with steps in flight: that worker's next
        run may be a replayed CUDA graph whose scratch is where the arena put the buffer, before the
        next card's worker reads it (wicore.executor.cuda_graphs)."""
        own, nxt = self.devices[partition].ort_device, self.devices[partition + 1].ort_device
        if nxt[0] == "cpu" or nxt == own:
            return nxt
        return ("cpu", 0) if self.replays_in_flight else own

    def prepare_replay(self, batch: BatchInputs, sampling: SamplingInputs | None = None) -> Replay | None:
        """A decode batch written ahead into its captured graphs' inputs (DecodeGraphs.prepare), for
        `run(..., replay=)`; None where `run` would not replay it (no graphs, a batch they do not take,
        several slots: a slot is the calling thread's, and a prepared step runs on another)."""
        graphs = self.decode_graphs
        if graphs is None or graphs.num_slots > 1 or not graphs.can_run(batch):
            return None
        if sampling is not None and not self.has_sampling_head:
            raise ValueError("this export has no sampling head (wicore-export --sampling-head on)")
        return graphs.prepare(batch, sampling)

    def run(
        self,
        batch: BatchInputs,
        logits: bool = True,
        images: dict[str, np.ndarray] | None = None,
        sampling: SamplingInputs | None = None,
        staged: StagedRun | None = None,
        replay: Replay | None = None,
    ) -> GraphOutputs:
        """Run every partition for one batch. With `logits` False and a graph that gives the greedy
        tokens, only those come back to the host (the logits stay on the device, unread). `images`:
        the image inputs of a multimodal export (wicore.executor.vision.VisionEncoder.decoder_inputs).
        `sampling` (exports with the sampling head): the rows' draws come back too. `staged`: the
        rows are offloaded, their full-attention blocks staged around each partition (uncaptured).
        `replay`: `batch` as `prepare_replay` wrote it (its sampling inputs too): only launched here."""
        want_logits = logits or not self.has_greedy_tokens
        if replay is not None and self.decode_graphs is not None:
            return self.decode_graphs.launch(replay, want_logits)
        if sampling is not None and not self.has_sampling_head:
            raise ValueError("this export has no sampling head (wicore-export --sampling-head on)")
        if staged is None and not images and self.decode_graphs is not None and self.decode_graphs.can_run(batch):
            return self.decode_graphs.run(batch, want_logits, sampling)
        if staged is None and not images and self.pipeline is not None:
            spans = self.pipeline.spans(batch)
            if len(spans) > 1 or self.pipeline_groups > 1:  # several steps in flight share the partitions' workers
                return self.pipeline.run(batch, spans, want_logits, sampling)
        hidden = None
        out: dict[str, Any] = {}
        mass = None
        for i in range(len(self.sessions)):
            out = self.run_partition(i, batch, hidden, want_logits, sampling, images, staged)
            hidden = out.get(io.HIDDEN_STATES_OUT)
            if io.ATTENTION_MASS in out:
                part = out[io.ATTENTION_MASS].numpy()
                mass = part if mass is None else mass + part
        if sampling is not None and self.head is not None:
            out |= self.head.run(out[io.LOGITS], sampling)
        return graph_outputs(out, want_logits, sampling is not None, mass)

    def run_partition(
        self,
        i: int,
        batch: BatchInputs,
        hidden: Any,
        want_logits: bool,
        sampling: SamplingInputs | None,
        images: dict[str, np.ndarray] | None = None,
        staged: StagedRun | None = None,
    ) -> dict[str, Any]:
        """Partition `i` on `batch`, after the one before it left `hidden` (an OrtValue; None for
        the first): its outputs by name, where `_result_devices` put them."""
        record, session = self.manifest.partitions[i], self.sessions[i]
        # Hidden states go straight to the next partition's device when this session can
        # write there (its own device, or host memory); between two accelerators they pass
        # through the host, since a session has no allocator for another card.
        results = self._result_devices(i, record, want_logits, sampling is not None)
        if staged is None and not images and self._keeps_binding(i, results):
            return self._run_kept(i, batch, hidden)
        binding = session.io_binding()
        for name, device in results.items():
            binding.bind_output(name, *device)
        self._bind_inputs(binding, i, batch, hidden, sampling, images)
        self.bind_kv(binding, record, staged)
        if staged is not None:
            staged.before(i)
        session.run_with_iobinding(binding, self._run_options)
        if staged is not None:
            staged.after(i)
        return dict(zip(results, binding.get_outputs()))

    def _keeps_binding(self, i: int, results: dict[str, tuple[str, int]]) -> bool:
        """Whether partition i's run reuses its binding of the step before (wicore.executor.kept_binding):
        a CPU partition whose run gives the host only its greedy tokens, run by the engine itself."""
        return self.pipeline is None and self.devices[i].ort_device[0] == "cpu" and results == {io.GREEDY_TOKENS: ("cpu", 0)}

    def _run_kept(self, i: int, batch: BatchInputs, hidden: Any) -> dict[str, Any]:
        record, session = self.manifest.partitions[i], self.sessions[i]
        kept = self.kept.binding(i, session, len(batch.logits_indices), self._kv_values(i), lambda b: self.bind_kv(b, record))
        if not record.has_embedding:
            self._bind_hidden(kept.binding, i, hidden)
        for name, array in self._step_inputs(i, batch, None, None).items():
            kept.bind_input(name, array)
        session.run_with_iobinding(kept.binding, self._run_options)
        return {io.GREEDY_TOKENS: HostTokens(kept.greedy.copy())}

    def _kv_values(self, i: int) -> tuple[Any, ...]:
        """Partition i's layers' KV OrtValues in bind_kv's order, listed once for the buffers bound (the
        same tuple each step: KeptBinding.matches compares it by identity first)."""
        listed = self._listed_kv.get(i)
        if listed is None or listed[0] is not self.buffers:
            record = self.manifest.partitions[i]
            values = tuple(v for layer in range(record.start, record.stop) for v in self.buffers.values(layer))
            listed = self._listed_kv[i] = (self.buffers, values)
        return listed[1]

    def _bind_inputs(
        self,
        binding: Any,
        i: int,
        batch: BatchInputs,
        hidden: Any,
        sampling: SamplingInputs | None,
        images: dict[str, np.ndarray] | None,
    ) -> None:
        """Partition i's step inputs: the token ids or the hidden states, the paging arrays, the
        logits' rows and the inline head's inputs where the graph takes them."""
        if not self.manifest.partitions[i].has_embedding:
            self._bind_hidden(binding, i, hidden)
        for name, array in self._step_inputs(i, batch, sampling, images).items():
            binding.bind_cpu_input(name, array)

    def _step_inputs(
        self, i: int, batch: BatchInputs, sampling: SamplingInputs | None, images: dict[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        """Partition i's host inputs the graph takes, by name: the token ids (the first partition),
        the paging arrays, the logits' rows and the inline head's inputs."""
        step_inputs = {name: getattr(batch, name) for name in self._batch_names[i]}
        others = dict(images or {})
        if self.manifest.partitions[i].has_lm_head and self.inline_head:
            head = sampling or SamplingInputs.unused(len(batch.logits_indices))
            others |= {io.SAMPLING_TEMPERATURE: head.temperature, io.SAMPLING_UNIFORM: head.uniform}
        names = self._input_names[i]
        return step_inputs | {name: array for name, array in others.items() if name in names}

    def _bind_hidden(self, binding, partition: int, hidden: Any) -> None:
        """Bind the hidden states the partition before left (an OrtValue) as this one's input: as they
        are where they lie on this partition's device or in host memory, else through host memory."""
        if hidden is None:
            raise ValueError(f"partition {partition} takes hidden states, but no partition before it made any")
        if self._handoff_device(partition - 1) == self.devices[partition].ort_device:
            binding.bind_ortvalue_input(io.HIDDEN_STATES, hidden)
        else:
            binding.bind_cpu_input(io.HIDDEN_STATES, hidden.numpy())

    def close(self) -> None:
        """Stop the pipeline's worker threads and let the sessions go (the weights and ORT's arenas:
        GiBs for a real model) now, not with this object: a served app's Starlette routes and state
        hold the engine in reference cycles, which only Python's cyclic collector frees, seldom. The
        graphs run nothing after this."""
        if self.pipeline is not None:
            self.pipeline.close()
        self.decode_graphs = None
        self.kept.clear()
        self.sessions = []

    def _result_devices(self, partition: int, record, want_logits: bool, draws: bool) -> dict[str, tuple[str, int]]:
        """The partition's outputs this step reads, and where each is written."""
        host = ("cpu", 0)
        if not record.has_lm_head:
            results = {io.HIDDEN_STATES_OUT: self._handoff_device(partition)}
        else:
            results = {}
            if want_logits or draws:  # with draws, unread unless a row needs them (read_logits)
                results[io.LOGITS] = host if want_logits else self.devices[partition].ort_device
            if self.has_greedy_tokens:
                results[io.GREEDY_TOKENS] = host
            if draws and self.inline_head:
                results.update({io.SAMPLED_TOKENS: host, io.TOP_PROBS: host, io.TOP_IDS: host})
        if record.has_attention_stats:
            results[io.ATTENTION_MASS] = host
        return results
