"""The engine's settings, in one frozen dataclass (its own module, so that the modules the engine
is built from can take it without importing the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from wicore.blocks.policy import A2CRConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    num_threads: int | None = None
    block_size: int | None = None  # tokens a KV block; None: default_block_size(the model)
    kv_pool_gb: float = 1.0  # tier 0
    host_tier_gb: float = 1.0  # tier 1
    nvme_tier_gb: float = 0.0  # tier 2
    nvme_dir: Path | None = None
    # Exact block counts per tier, overriding the sizes above (tests, tuning).
    num_device_blocks: int | None = None
    num_host_blocks: int | None = None
    num_nvme_blocks: int | None = None
    num_window_device_blocks: int | None = None  # the sliding layers' device buffers, if set apart
    policy: str = "a2cr"  # or "lru"
    a2cr: A2CRConfig = field(default_factory=A2CRConfig)
    enable_prefix_cache: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    verify_files: bool = True
    devices: str = "cpu"  # see wicore.devices.placement
    profile_prefix: str | None = None  # ONNX Runtime's profiler on (tools/profile_step.py)
    # Decode steps replayed from CUDA graphs (a paged export on one CUDA device), or on the WebGPU device
    # from the EP's captured command buffers (a paged webgpu-flavour export). None: on wherever they can
    # be on CUDA and the KV blocks are the paged attention's FlashAttention tile or a multiple; WebGPU's
    # only when True (not yet measured on a GPU).
    cuda_graphs: bool | None = None
    vision_device: str | None = None  # where the vision partition runs; None: the first partition's device
    image_cache_size: int = 64  # images whose features are kept (each distinct image is encoded once)
    speculative: SpeculativeConfig | None = None  # speculative decoding (wicore.engine.speculative); None: off
    # Long sequences whose full-attention KV does not fit the device (wicore.kv.offload): 0, off;
    # else their blocks may lie in the host tier too, and each step that runs one stages up to this
    # many tokens of its batch's blocks into stage buffers (taken from kv_pool_gb) for the graphs to read.
    kv_offload_tokens: int = 0
    # Partitions on several devices (wicore.executor.pipeline): a step of at least twice this many
    # tokens runs as micro-batches of rows that keep every device busy. None: 512 where the partitions
    # span several devices, else off; 0: off.
    micro_batch_tokens: int | None = None
    # Schedule and build step N+1 while step N runs on a worker thread, N+1's decode rows fed from
    # N's sampled ids (wicore.engine.lookahead): less idle device time between steps. Not with
    # speculative decoding. None: on where it was measured to pay (`async_by_default`), else off.
    async_scheduling: bool | None = None
    # Partitions on several devices (wicore.engine.groups): up to this many steps in flight at once,
    # each over its own requests, so that every device runs one of them. 1: off (the default until a
    # run on two cards measures it); None: one a device where the partitions span several devices
    # (unless async scheduling or a vision partition is on), else 1.
    pipeline_groups: int | None = 1
    # A decode step that repeats the last one a token on (the same requests, nothing admitted, ended or
    # preempted) advances its rows and batch instead of scheduling and building them again
    # (wicore.engine.steady): the same steps and tokens, half the host work a step. Never with a step
    # in flight (async scheduling, the default on one CUDA card) or speculative decoding. False: every
    # step scheduled in full (A/B runs, tests).
    steady_decode: bool = True

    def __post_init__(self) -> None:
        if self.policy not in ("a2cr", "lru"):
            raise ValueError(f"policy {self.policy!r}: choose a2cr or lru")
        for flag, size in (
            ("--kv-pool-gb", self.kv_pool_gb),
            ("--host-tier-gb", self.host_tier_gb),
            ("--nvme-tier-gb", self.nvme_tier_gb),
        ):
            if size < 0:
                raise ValueError(f"{flag} {size:g}: a tier's size is >= 0 GiB")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 0:
            raise ValueError(f"micro_batch_tokens must be >= 0 (0: off), got {self.micro_batch_tokens}")
        if self.kv_offload_tokens < 0:
            raise ValueError(f"kv_offload_tokens must be >= 0 (0: off), got {self.kv_offload_tokens}")
        if self.pipeline_groups is not None and self.pipeline_groups < 1:
            raise ValueError(f"pipeline_groups must be >= 1 (1: off), got {self.pipeline_groups}")
        if (self.pipeline_groups or 1) > 1 and (self.async_scheduling or self.speculative or self.kv_offload_tokens):
            raise ValueError(
                "pipeline_groups > 1 does not combine with async_scheduling, speculative decoding or kv_offload_tokens: "
                "set pipeline_groups to 1 or turn those off"
            )
        if self.async_scheduling and self.speculative is not None:
            raise ValueError("async scheduling does not combine with speculative decoding: turn one of them off")


def async_by_default(config: EngineConfig, cuda_graphs_on_one_device: bool) -> bool:
    """EngineConfig.async_scheduling where the config leaves it None: on where the steps replay CUDA
    graphs on one CUDA device and nothing makes every step synchronous anyway (speculative decoding,
    offloaded KV, steps in flight over groups). There it gave 1.12-1.18x the output tokens at 64
    requests and 1.25-1.44x at 256 on an H200, with the plain engine's rows in every step
    (docs/PERFORMANCE.md, 2026-11-29); on the 2-core CPU VM it gained nothing, and over several
    cards, or with the WebGPU EP's captured steps (the same switch, `cuda_graphs`), it is not measured."""
    if config.async_scheduling is not None:
        return config.async_scheduling
    excluded = config.speculative is not None or config.kv_offload_tokens > 0 or (config.pipeline_groups or 1) > 1
    return cuda_graphs_on_one_device and not excluded
