"""Decode steps timed through the engine's own core, for profile_step.py and bench_shapes.py.

`decode_steps` prefills `batch` requests of `config.context` random prompt tokens in an engine made
by `engine_config` (a device tier that holds them to their last token, and nothing more), then
warms up and times decode steps: each step's runner phase (`core.last_step`) and the graphs alone
on the same rows (profile_step.py's docstring says how to read them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.executor.batch import build_batch
from wicore.graph.manifest import Manifest
from wicore.kv.layout import choose_block_size
from wicore.types.sampling import SamplingParams

NUM_WARMUP_STEPS = 3
NUM_SPARE_TOKENS = 8  # beyond what the first rows decode while the last ones prefill; none may end while timed


@dataclass(frozen=True)
class Config:
    model_dirs: tuple[str, ...]
    batches: tuple[int, ...]
    context: int
    threads: int
    num_steps: int
    devices: str
    profile: bool
    json_path: Path | None
    gpu_kernels: bool = False
    block_size: int | None = None  # None: the engine's default for the model
    temperature: float = 0.0  # > 0: the rows sample, through the export's sampling head or on the host
    top_k: int = 0
    top_p: float = 0.95
    cuda_graphs: bool | None = None  # EngineConfig.cuda_graphs: decode steps replayed from captured graphs

    def __post_init__(self) -> None:
        if min(self.batches, default=0) < 1 or self.context < 1 or self.num_steps < 1:
            raise ValueError("--batch sizes, --context and --steps must be positive")


@dataclass(frozen=True)
class StepTimes:
    graphs_seconds: list[float]
    step_seconds: list[float]


def num_new_tokens(batch: int, config: Config) -> int:
    """Tokens each request generates: the warm-up and timed steps, plus one a step for the steps
    its row decodes while later rows still prefill (at most `prefill_with_decodes` prompt tokens
    a step once any row decodes: at batch 32 and context 512, ~32 steps)."""
    prefill_steps = -(-batch * config.context // SchedulerConfig().prefill_with_decodes)
    return NUM_WARMUP_STEPS + config.num_steps + prefill_steps + NUM_SPARE_TOKENS


def engine_config(model_dir: Path, batch: int, config: Config, profile_prefix: str | None = None) -> EngineConfig:
    """An engine whose device tier holds `batch` sequences to their last token, and nothing more."""
    tokens = config.context + num_new_tokens(batch, config)
    block_size = choose_block_size(Manifest.read(model_dir), config.block_size)  # the engine will pick the same
    return EngineConfig(
        model_dir=model_dir,
        num_threads=config.threads,
        block_size=block_size,
        num_device_blocks=1 + batch * -(-tokens // block_size),  # the sink, then each row's blocks
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,
        scheduler=SchedulerConfig(max_num_seqs=batch),
        devices=config.devices,
        profile_prefix=profile_prefix,
        cuda_graphs=config.cuda_graphs,
        async_scheduling=False,  # stepped one at a time here: step N+1 must not be queued behind N
    )


def decode_steps(engine: Engine, batch: int, config: Config) -> StepTimes:
    """Prefill `batch` requests of `config.context` random prompt tokens, then warm up and time
    decode steps (see the module docstring)."""
    rng = np.random.default_rng(batch)
    params = SamplingParams(
        max_tokens=num_new_tokens(batch, config),
        ignore_eos=True,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )
    core = engine.core  # stepped here, without the engine's thread: requests go to it straight
    vocab_size = engine.manifest.config.vocab_size
    for i in range(batch):  # ids past the special tokens (a tiny test model's vocabulary has 512)
        prompt = rng.integers(min(1000, vocab_size // 2), vocab_size, config.context).tolist()
        core.add(core.make_request(prompt, params, f"step-timing-{i}"))
    times = StepTimes([], [])
    num_decodes = 0
    while num_decodes < NUM_WARMUP_STEPS + config.num_steps:
        outputs = core.step()
        trace = core.last_step
        if not trace.rows or trace.num_lost or any(o.finished for o in outputs):
            raise RuntimeError(f"after {num_decodes} decode steps: a request ended, lost KV or was not scheduled")
        if any(o.finish_reason == "error" for o in outputs):
            raise RuntimeError(f"sampling failed: {next(o.error for o in outputs if o.error)}")
        if len(trace.rows) == batch and all(len(r.token_ids) == 1 for r in trace.rows):
            num_decodes += 1
            if num_decodes > NUM_WARMUP_STEPS:
                # The graphs alone on the same rows (their KV written again, with the same values).
                start = time.perf_counter()
                core.runner.graphs.run(build_batch(list(trace.rows), engine.layout.block_size))
                times.graphs_seconds.append(time.perf_counter() - start)
                times.step_seconds.append(trace.seconds.run_s)
    return times
