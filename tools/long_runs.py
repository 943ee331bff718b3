"""One long request through the engine's own core, its times and device memory: bench_long_shapes.py,
bench_full_depth.py and probe_engine_memory.py measure with it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wicore.blocks.block_groups import FULL, WINDOW
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.graph.manifest import Manifest
from wicore.kv.layout import KVLayout, choose_block_size
from wicore.kv.offload import num_stages
from wicore.types.sampling import SamplingParams

GIB = 1 << 30


@dataclass(frozen=True)
class Config:
    shape: str
    contexts: tuple[int, ...]
    variants: tuple[str, ...]
    prefill_chunk: int
    decode_steps: int
    devices: str
    work: Path
    hf: bool
    json_path: Path | None
    offload_fractions: tuple[float, ...] = ()  # device share of the full layers' blocks, offloaded runs


class DeviceMemory:
    """Used device memory above a baseline, its peak over every `sample()` (cudaMemGetInfo sees
    ONNX Runtime's allocations as well as torch's)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch if torch.cuda.is_available() else None
        self.base = self._used()
        self.peak = 0

    def _used(self) -> int:
        if self._torch is None:
            return 0
        free, total = self._torch.cuda.mem_get_info()
        return total - free

    def sample(self) -> None:
        self.peak = max(self.peak, self._used() - self.base)


def wicore_long(
    model_dir: Path, context: int, config: Config, fraction: float | None = None, memory: DeviceMemory | None = None
) -> dict[str, float | bool]:
    """Prefill seconds and median decode ms of one request of `context` tokens (after a warm-up
    request), and device GiB: resident once the engine is up (weights, KV buffers, sessions) and
    the peak above that (activations, ONNX Runtime's arenas). With `fraction`, the device tier holds
    that share of the full layers' blocks, the host tier the rest, and every step stages them.
    `memory` measures the device (default: DeviceMemory, above what was used before the engine)."""
    memory = memory if memory is not None else DeviceMemory()
    tokens = context + config.decode_steps + 4
    chunk = config.prefill_chunk
    manifest = Manifest.read(model_dir)
    block_size = choose_block_size(manifest, None)  # the engine's default
    layout = KVLayout.of(manifest, block_size)
    window_blocks = layout.window_blocks_per_sequence(chunk) + 1
    full_blocks = 1 + -(-tokens // block_size)
    offload: dict[str, int] = {"num_host_blocks": 0}
    stage_bytes = 0
    if fraction is not None:
        offload = dict(kv_offload_tokens=tokens, num_host_blocks=full_blocks)
        stage_bytes = num_stages(manifest) * (full_blocks + 1) * layout.layer_block_bytes
        full_blocks = max(2, round(fraction * full_blocks) + 1)
    kv_bytes = full_blocks * layout.block_bytes(FULL) + (window_blocks * layout.block_bytes(WINDOW) if layout.has_window else 0)
    weight_bytes = sum(f.stat().st_size for f in model_dir.iterdir() if f.suffix in (".onnx", ".data"))
    scheduler = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=chunk, prefill_with_decodes=chunk, prefill_chunk=chunk)
    engine_config = EngineConfig(
        model_dir=model_dir, devices=config.devices, num_threads=2, block_size=block_size,
        num_device_blocks=full_blocks, num_window_device_blocks=window_blocks, num_nvme_blocks=0,
        enable_prefix_cache=False, scheduler=scheduler, async_scheduling=False,  # each step alone
        **offload,  # type: ignore[arg-type]
    )  # fmt: skip
    with Engine(engine_config) as engine:
        memory.sample()
        resident = memory.peak  # sessions (weights, prepacked copies), KV pools, stage
        rng = np.random.default_rng(context)
        vocab = engine.manifest.config.vocab_size
        run_request(engine, rng.integers(1000, vocab, min(2 * chunk, context)).tolist(), 4, memory)  # warm-up
        warm = memory.peak  # + what a short request's steps (and CUDA graph captures) keep in the arenas
        prefill, decode, tokens = run_request(
            engine, rng.integers(1000, vocab, context).tolist(), config.decode_steps + 1, memory
        )
        captured = bool(engine.config.cuda_graphs)
        offloader = engine.core.runner.offloader
        staged = offloader.stats if offloader is not None else None
    return {
        "prefill_s": prefill,
        "decode_ms": 1000 * statistics.median(decode),
        "weights_gib": weight_bytes / GIB,
        "kv_gib": kv_bytes / GIB,
        "stage_gib": stage_bytes / GIB,
        "resident_gib": resident / GIB,
        "after_warm_up_gib": warm / GIB,
        "peak_gib": memory.peak / GIB,
        "overhead_gib": (memory.peak - weight_bytes - kv_bytes - stage_bytes) / GIB,
        "cuda_graphs": captured,
        "tokens": tokens,
        **(
            {} if staged is None else {"staged_from_host": staged.num_host_blocks, "staged_from_device": staged.num_device_blocks}
        ),
    }


def run_request(engine: Engine, prompt: list[int], max_tokens: int, memory: DeviceMemory) -> tuple[float, list[float], list[int]]:
    """One request stepped through the engine's core (its thread not started): seconds of the
    runner in the steps that prefill, and in each decode step after them, and the greedy tokens."""
    core = engine.core
    request = core.make_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), f"long-{time.monotonic_ns()}")
    core.add(request)
    prefill, decode, tokens = 0.0, [], []
    while core.has_work:
        outputs = core.step()
        trace = core.last_step
        if trace.num_lost:
            raise RuntimeError(f"{len(prompt)} tokens: the engine lost KV blocks (the pool is too small)")
        memory.sample()
        for o in outputs:
            if o.finish_reason == "error":
                raise RuntimeError(f"{len(prompt)} tokens: {o.error}")
            tokens += o.new_token_ids
        if any(len(r.token_ids) > 1 for r in trace.rows):
            prefill += trace.seconds.run_s
        elif trace.rows:
            decode.append(trace.seconds.run_s)
    return prefill, decode, tokens
