"""`wicore plan`: where each partition would run and what it holds, then for a memory budget the
longest context one sequence can have and how many sequences of a length fit. Loads no weights.

`--model` names an export (or a packaged model, exported on first use as `serve` does), or a
checkpoint's config.json alone (the file, or the Hugging Face folder holding it): a model too
large to export here, such as Gemma-3-27B, is planned from its shape, with its weights estimated
as `wicore-export --dtype --weight-bits --attention` would write them (wicore.kv.capacity).
A Hugging Face Hub id (`Qwen/Qwen3-30B-A3B`) is planned from its config.json, fetched alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from wicore.cli.flags import ENGINE_SETTINGS, as_flags
from wicore.errors import UsageError

if TYPE_CHECKING:
    from wicore.kv.capacity import Workload
    from wicore.model.config import DecoderConfig


def add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="show which device would run each partition, and what context fits a memory budget (loads no weights)"
    )
    p.add_argument(
        "--model",
        required=True,
        help="exported model folder, a packaged name (exported on first use, as serve does), a checkpoint's config.json, "
        "or a Hugging Face Hub id (its config.json alone is fetched)",
    )
    p.add_argument("--devices", default="auto", help="auto, cpu, cuda:0,cuda:1, openvino:CPU,cpu, ...")
    p.add_argument("--vision-device", default=None, help="where the vision partition runs (default: the first partition's)")
    p.add_argument("--kv-pool-gb", type=float, default=1.0, help="KV pool to place beside the weights")
    p.add_argument(
        "--budget-gb",
        type=float,
        default=None,
        help="memory for weights, KV and activations (default: 90%% of the devices' free)",
    )
    p.add_argument(
        "--context", type=int, default=None, help="tokens a sequence holds, to count how many fit (default: the model's)"
    )
    p.add_argument("--block-size", type=int, default=None, help="tokens a KV block (default: the engine's for the model)")
    p.add_argument("--prefill-chunk", type=int, default=256, help="as wicore serve's")
    p.add_argument("--max-batched-tokens", type=int, default=2048, help="as wicore serve's")
    config = p.add_argument_group("a config.json alone: the export to plan for (wicore-export's flags)")
    config.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    config.add_argument("--weight-bits", type=int, choices=(4, 8), default=None, help="the ort-quant flavour's weights")
    config.add_argument(
        "--expert-bits",
        type=int,
        choices=(4, 8),
        default=None,
        help="with --weight-bits: a mixture's expert weights in these bits",
    )
    config.add_argument(
        "--quantize-embedding", action="store_true", help="with --weight-bits: the embedding's rows in those bits too"
    )
    config.add_argument("--attention", choices=("portable", "paged"), default="portable")
    config.add_argument("--kv-cache-dtype", choices=("auto", "int8"), default="auto", help="int8: KV blocks in 8 bits")
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from wicore.kv.capacity import plan_capacity
    from wicore.kv.layout import KVLayout

    config_file = checkpoint_config(args.model)
    if config_file is None and not is_model_name_or_path(args.model):
        raise UsageError(
            f"--model {args.model}: no such file or folder; wicore plan takes an exported model, a named one, a .gguf "
            "file, a checkpoint's config.json alone (the file, or the Hugging Face folder holding it) or a Hub id"
        )
    if config_file is None:
        cfg, kv_dtype, weights, block_size, paged, devices = exported_model(args)
    else:
        cfg, kv_dtype, weights, block_size, paged, devices = config_only(args, config_file)
    context = cfg.max_position_embeddings if args.context is None else args.context
    if not 0 < context <= cfg.max_position_embeddings:
        raise UsageError(f"--context {context}: the model takes 1 to {cfg.max_position_embeddings} tokens")
    if min(args.prefill_chunk, args.max_batched_tokens, block_size) < 1:
        raise UsageError("--prefill-chunk, --max-batched-tokens and --block-size must be positive")
    try:
        layout = KVLayout.of_config(cfg, kv_dtype, block_size)
    except ValueError as exc:  # a model the engine cannot run
        raise UsageError(str(exc)) from exc
    work = engine_workload(cfg, args.prefill_chunk, args.max_batched_tokens, paged)
    plan = plan_capacity(cfg, layout, kv_dtype, weights, budget_bytes(args, devices), context, work)
    print(as_flags(plan.describe(), ENGINE_SETTINGS))
    return 0


def engine_workload(cfg: DecoderConfig, prefill_chunk: int, max_batched_tokens: int, paged: bool) -> Workload:
    """The step limits the engine runs `cfg` with, from serve's flags: a LongRoPE model's are raised
    so that a chunk of its switch + 1 tokens fits a step (SchedulerConfig.with_long_rope), and the
    plan counts that chunk's activations; that one line is printed."""
    from wicore.engine.scheduler_config import SchedulerConfig
    from wicore.kv.capacity import Workload

    steps = SchedulerConfig(prefill_chunk=prefill_chunk, max_num_batched_tokens=max_batched_tokens)
    switch = cfg.long_rope_switch
    if switch:
        steps = steps.with_long_rope(switch)
        print(
            f"LongRoPE: a sequence past {switch} tokens runs its first {switch + 1} in one prefill chunk, so steps "
            f"take up to {steps.max_num_batched_tokens} tokens (as wicore serve raises them)"
        )
    return Workload(steps.prefill_chunk, steps.max_num_batched_tokens, paged)


def is_model_name_or_path(spec: str) -> bool:
    from wicore.export.hub import parse_hub_id
    from wicore.export.pull import PULLABLE
    from wicore.export.sources import PACKAGED

    return spec in PACKAGED or spec in PULLABLE or Path(spec).exists() or parse_hub_id(spec) is not None


def checkpoint_config(spec: str) -> Path | None:
    """The config.json `--model` names, if it names a checkpoint's config rather than an export: a
    file, a folder holding one, or a Hugging Face Hub id (its config.json alone is fetched)."""
    from wicore.export.hub import hub_config, parse_hub_id
    from wicore.graph.manifest import MANIFEST

    path = Path(spec)
    hub = parse_hub_id(spec)
    if hub is not None and hub.quant is None:
        return hub_config(hub, lambda message: print(f"[wicore plan] {message}", file=sys.stderr, flush=True))
    if path.is_file() and path.suffix == ".json":
        return path
    if (path / "config.json").is_file() and not (path / MANIFEST).is_file():
        return path / "config.json"
    return None


def exported_model(args: argparse.Namespace):
    """(config, KV dtype, weight bytes, block size, paged, devices) of an export, its placement printed."""
    from wicore.cli.models import resolve_model
    from wicore.devices.placement import GIB, plan_placement
    from wicore.graph.manifest import Manifest
    from wicore.kv.layout import choose_block_size

    model_dir = resolve_model(args.model, args.devices, is_installed=False)
    manifest = Manifest.read(model_dir)
    plan = plan_placement(model_dir, manifest, args.devices, int(args.kv_pool_gb * GIB), args.vision_device, is_installed=False)
    print(as_flags(plan.describe(), ENGINE_SETTINGS))
    weights = sum(p.weight_bytes for p in plan.placements) + (plan.vision.weight_bytes if plan.vision else 0)
    devices = list(dict.fromkeys([*plan.devices, *([plan.vision.device] if plan.vision else [])]))
    block_size = choose_block_size(manifest, args.block_size)
    return manifest.config, manifest.kv_dtype, weights, block_size, manifest.attention == "paged", devices


def config_only(args: argparse.Namespace, config_file: Path):
    """The same for a checkpoint's config.json, as wicore-export would export it with the flags given."""
    import numpy as np

    from wicore.devices.placement import device_list
    from wicore.export.exporter import ExportConfig
    from wicore.graph.decoder import DTYPES
    from wicore.kv.capacity import estimate_vision_bytes, estimate_weight_bytes
    from wicore.kv.layout import block_size_for
    from wicore.model.config import DecoderConfig
    from wicore.model.vision import VisionConfig

    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {config_file}: {exc}") from exc
    paged = args.attention == "paged"
    try:
        cfg = DecoderConfig.from_hf(raw)
        vision = None if paged else VisionConfig.from_hf(raw, {})  # a paged export leaves the vision tower out
    except KeyError as exc:
        raise UsageError(f"{config_file} is not a model config WiCore reads: it has no {exc}") from exc
    if args.expert_bits and not cfg.num_experts:
        raise UsageError(f"--expert-bits: {config_file} has no experts (an option for mixtures of experts); drop it")
    flavour = "ort-quant" if args.weight_bits else "portable"
    ExportConfig(
        dtype=args.dtype,
        op_flavour=flavour,
        weight_bits=args.weight_bits or 8,
        expert_bits=args.expert_bits,
        quantize_embedding=args.quantize_embedding,
        attention=args.attention,
        kv_cache_dtype=args.kv_cache_dtype,
    )  # its checks
    dtype = np.dtype(DTYPES[args.dtype][0])  # of the weights and the KV, as in an export
    vision_bytes = estimate_vision_bytes(vision, dtype.itemsize) if vision else 0
    weights = (
        estimate_weight_bytes(cfg, dtype.itemsize, args.weight_bits, args.quantize_embedding, args.expert_bits) + vision_bytes
    )
    block_size = args.block_size or block_size_for(cfg, args.attention)
    kv_dtype = "int8" if args.kv_cache_dtype == "int8" else dtype.name
    print(
        f"{config_file}: {cfg.num_layers} layers ({cfg.layer_types.count('full_attention')} full attention), "
        f"{cfg.num_kv_heads} KV heads x {cfg.head_dim}, window {cfg.sliding_window}, context {cfg.max_position_embeddings}"
        + (
            f", {cfg.num_experts} experts x {cfg.moe_intermediate_size} a layer ({cfg.num_experts_per_tok} a token)"
            if cfg.num_experts
            else ""
        )
        + "; "
        f"as exported with --dtype {args.dtype}"
        + (f" --op-flavour {flavour} --weight-bits {args.weight_bits}" if args.weight_bits else "")
        + (f" --expert-bits {args.expert_bits}" if args.expert_bits else "")
        + (" --quantize-embedding" if args.quantize_embedding else "")
        + f" --attention {args.attention}"
        + (" --kv-cache-dtype int8" if kv_dtype == "int8" else "")
        + f": weights {weights / (1 << 30):.2f}G (estimated from the shape"
        + (f"; the vision tower's {vision_bytes / (1 << 30):.2f}G included)" if vision_bytes else ")")
    )
    devices = [] if args.budget_gb is not None else device_list(args.devices, is_installed=False)[:1]
    return cfg, kv_dtype, weights, block_size, paged, devices


def budget_bytes(args: argparse.Namespace, devices: list) -> int:
    """--budget-gb, or 90% of the free memory of `devices` (as placement plans)."""
    from wicore.devices.placement import GIB, HEADROOM

    if args.budget_gb is not None:
        if args.budget_gb <= 0:
            raise UsageError(f"--budget-gb {args.budget_gb}: give a positive size")
        return int(args.budget_gb * GIB)
    free = [d.free_bytes() for d in devices]
    if not free or None in free:
        unknown = ", ".join(d.label for d, f in zip(devices, free) if f is None)
        raise UsageError(f"the free memory of {unknown or 'the device'} is unknown: give --budget-gb")
    return int(sum(free) * HEADROOM)
