"""The engine flags `generate` and `serve` share, and the EngineConfig they make."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wicore.cli.speculative_args import add_speculative_args, speculative_config
from wicore.errors import UsageError


class DeprecatedAlias(argparse.Action):
    """An old flag name kept working: it stores into the new flag's dest and prints a one-line notice."""

    def __init__(self, option_strings: Sequence[str], dest: str, new_flag: str, **kwargs: Any) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        print(f"wicore: {option} is deprecated, use {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, values)


SWITCH = {"auto": None, "on": True, "off": False}  # a switch flag's value: EngineConfig's None (auto) / True / False


def add_switch(p: argparse.ArgumentParser, flag: str, help: str, default: str = "auto") -> None:
    """An auto / on / off flag (`SWITCH`), auto unless `default` says otherwise; the bare flag means on."""
    p.add_argument(flag, nargs="?", const="on", default=default, choices=tuple(SWITCH), help=help)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Where the model runs, its KV tiers and the scheduler's limits: `generate` and `serve` alike."""
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--devices", default="cpu", help="where partitions run: cpu, auto, cuda:0, openvino:CPU,cpu ...")
    p.add_argument("--vision-device", default=None, help="where the vision partition runs (default: the first partition's)")
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens a KV block (default 16; a paged-attention export: 64-256, as its kernels need)",
    )
    p.add_argument(
        "--kv-pool-gb",
        type=float,
        default=None,
        help="tier 0 (device) KV pool, GiB (default: what one sequence of the model's whole context needs, at least 1)",
    )
    p.add_argument("--host-tier-gb", type=float, default=1.0, help="tier 1 (host RAM) KV blocks")
    p.add_argument("--nvme-tier-gb", type=float, default=0.0, help="tier 2 (NVMe file) KV blocks")
    p.add_argument("--nvme-dir", type=Path, default=None)
    p.add_argument(
        "--kv-offload-tokens",
        type=int,
        default=0,
        help="let a long sequence's full-attention KV lie partly in the host tier: each step that runs one copies "
        "up to this many tokens of its batch's blocks into stage buffers (taken from --kv-pool-gb); exact, slower "
        "(0: off; export with --partitions so each partition holds one full-attention layer)",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="partitions on several devices: a step of at least twice this many tokens runs as micro-batches of rows "
        "that keep every device busy at once (default: 512 where the partitions span several devices; 0: off)",
    )
    p.add_argument(
        "--pipeline-groups",
        type=int,
        default=1,
        help="partitions on several devices: up to N steps in flight at once, each over its own requests, so every "
        "device works at decode too (default 1: off; 2 for two cards)",
    )
    p.add_argument(  # the flag's name until issue 30 ("stream" now means SSE outputs alone)
        "--kv-stream-tokens",
        dest="kv_offload_tokens",
        type=int,
        action=DeprecatedAlias,
        new_flag="--kv-offload-tokens",
        help=argparse.SUPPRESS,
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="sequences one step runs at most; each reserves sliding-window KV blocks in the pool (default: %(default)s)",
    )
    p.add_argument("--max-batched-tokens", type=int, default=2048, help="tokens one step may run (decodes first)")
    p.add_argument(
        "--prefill-with-decodes",
        type=int,
        default=512,
        help="prefill tokens a step may run while requests decode (lower: steadier inter-token latency)",
    )
    p.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens one request may prefill per step")
    p.add_argument("--max-context", type=int, default=None, help="tokens per sequence (default: the model's)")
    p.add_argument("--policy", choices=("a2cr", "lru"), default="a2cr")
    p.add_argument("--a2cr-weights", default="0.4,0.3,0.3", help="A2CR weights: attention,frequency,recency")
    p.add_argument("--a2cr-decay", type=float, default=0.05, help="A2CR history decay, per minute")
    p.add_argument("--no-prefix-cache", action="store_true")
    add_switch(
        p,
        "--cuda-graphs",
        "replay decode steps from CUDA graphs (an --attention paged export on cuda devices); auto (the "
        "default): on one device when the KV blocks are the paged attention's FlashAttention tile or a multiple of it; "
        "over several (a split) only with on: each card replays its own; on the webgpu device (an --op-flavour webgpu "
        "--attention paged export) only with on: the WebGPU EP's recorded command buffers (docs/HARDWARE.md)",
    )
    add_switch(
        p,
        "--async-scheduling",
        "plan each step while the one before runs on a worker thread (the same rows in every step, less idle "
        "device time; not with speculative decoding); auto (the default): on where decode steps replay CUDA graphs "
        "on one card and no speculative decoding, KV offload or steps in flight make steps synchronous",
    )
    add_speculative_args(p)


def check_tier_sizes(args: argparse.Namespace) -> None:
    """The KV tiers' sizes, refused before a named model is exported (EngineConfig checks them again)."""
    for flag, size in (
        ("--kv-pool-gb", args.kv_pool_gb),
        ("--host-tier-gb", args.host_tier_gb),
        ("--nvme-tier-gb", args.nvme_tier_gb),
    ):
        if size is not None and size < 0:
            raise UsageError(f"{flag} {size:g}: a tier's size is >= 0 GiB")


def engine_config(args: argparse.Namespace, model_dir: Path):  # -> EngineConfig
    from wicore.blocks.policy import A2CRConfig
    from wicore.engine.engine import EngineConfig
    from wicore.engine.scheduler import SchedulerConfig

    try:
        weights = [float(w) for w in str(args.a2cr_weights).split(",")]
        if len(weights) != 3:
            raise ValueError(f"--a2cr-weights {args.a2cr_weights!r}: give three numbers, attention,frequency,recency")
        w_attention, w_frequency, w_recency = weights
        config = EngineConfig(
            model_dir=model_dir,
            num_threads=args.threads,
            block_size=args.block_size,
            kv_pool_gb=args.kv_pool_gb if args.kv_pool_gb is not None else 1.0,
            host_tier_gb=args.host_tier_gb,
            nvme_tier_gb=args.nvme_tier_gb,
            nvme_dir=args.nvme_dir,
            kv_offload_tokens=args.kv_offload_tokens,
            micro_batch_tokens=args.micro_batch_tokens,
            pipeline_groups=args.pipeline_groups,
            policy=args.policy,
            enable_prefix_cache=not args.no_prefix_cache,
            devices=args.devices,
            vision_device=args.vision_device,
            cuda_graphs=SWITCH[args.cuda_graphs],
            a2cr=A2CRConfig(w_attention, w_frequency, w_recency, decay=args.a2cr_decay),
            speculative=speculative_config(args),
            async_scheduling=SWITCH[args.async_scheduling],
            scheduler=SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_batched_tokens,
                prefill_chunk=args.prefill_chunk,
                prefill_with_decodes=args.prefill_with_decodes,
                **({"max_context": args.max_context} if args.max_context else {}),
            ),
        )
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    if args.kv_pool_gb is None:  # the flags are valid: size the pool for the model
        return dataclasses.replace(config, kv_pool_gb=default_kv_pool_gb(args, model_dir))
    return config


def default_kv_pool_gb(args: argparse.Namespace, model_dir: Path) -> float:
    """--kv-pool-gb when not given: room for one sequence of the model's (or --max-context's) whole context."""
    from wicore.graph.manifest import Manifest
    from wicore.kv.layout import KVLayout, choose_block_size, default_pool_gb

    manifest = Manifest.read(model_dir)
    context = min(manifest.config.max_position_embeddings, args.max_context or manifest.config.max_position_embeddings)
    layout = KVLayout.of(manifest, choose_block_size(manifest, args.block_size))
    return default_pool_gb(layout, context, args.prefill_chunk, args.max_num_seqs)


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read prompt file {path}: {exc.strerror}") from exc
