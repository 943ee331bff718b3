"""What an offloaded step's copies cost at an exported model's real shapes, per full-attention layer.

An offloaded step (wicore.kv.offload) fills each full layer's stage from the device tier (a
gather on the device) and the host tier (a copy in), then sends the block it wrote home. This
times one decode step's stage and unstage (each per full layer) of a sequence of N tokens with `--device-fraction` of its
blocks on the device and the rest in the host tier, four ways:

    pinned      the host tier page-locked, as WiCore allocates it when the pools are on CUDA
    pageable    a plain NumPy host tier (the copy in goes through the driver's staging buffers)
    x consecutive  the sequence's host blocks in consecutive frames: one slice, copied as it lies
    x scattered    in frames spread over a tier twice as large: gathered into page-locked room first

It also times the pager's device-tier writes (OrtPoolStore.write_many: a put graph per run of
consecutive frames) against one ScatterND run over the same frames, the way they were written
before (ONNX Runtime 1.31's ScatterND moves fp16 blocks at ~0.5 GB/s on an H100).

    PYTHONPATH=/tmp/site:. python3 tools/bench_stage_copy.py --model /tmp/long/gemma3-27b-s1f1-paged-split \\
        --contexts 8192,32768,131072 --json stage.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import int_list, write_record
from onnx import helper

from wicore.blocks.tier import Tier
from wicore.devices.pinned import pinned_zeros
from wicore.devices.providers import onnxruntime, parse_device, session_options
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers
from wicore.kv.device_store import OrtPoolStore
from wicore.kv.layout import choose_block_size
from wicore.kv.offload import KVOffloader
from wicore.kv.tiers import HostStore
from wicore.types.sampling import SamplingParams
from wicore.types.step import ScheduledRow

GB = 1e9


@dataclass(frozen=True)
class Config:
    model: Path
    contexts: tuple[int, ...]
    device_fraction: float
    device: str
    repeat: int
    json_path: Path | None


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of `fn` over `repeat` runs after one warm-up (every run here synchronizes)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_step(config: Config, manifest: Manifest, context: int, pinned: bool, scattered: bool) -> dict[str, float]:
    """One decode step's stage and unstage over every partition, ms per full layer."""
    device = parse_device(config.device)
    devices = [device] * len(manifest.partitions)
    block_size = choose_block_size(manifest, None)
    blocks = -(-context // block_size)
    on_device = max(1, round(config.device_fraction * blocks))
    in_host = blocks - on_device
    cache = CacheConfig(num_blocks=on_device + 1, block_size=block_size, num_window_blocks=2)
    buffers = KVBuffers(manifest, cache, devices)
    full = [i for i in range(manifest.config.num_layers) if not manifest.config.is_sliding(i)]
    host_frames = 2 * in_host if scattered else in_host
    host = HostStore(host_frames, (len(full), 2, *buffers.block_shape), buffers.dtype, pinned_zeros if pinned else np.zeros)
    host.data[...] = 1  # every page touched, as a tier in use would be
    offloader = KVOffloader(manifest, buffers, host, blocks + 2)
    rng = np.random.default_rng(context)
    frames = np.sort(rng.choice(host_frames, in_host, replace=False)) if scattered else np.arange(in_host)
    locations = tuple((Tier.HOST, int(f)) for f in frames) + tuple((Tier.DEVICE, 1 + i) for i in range(on_device))
    row = ScheduledRow("r", [1], context - 1, [], [], [], 0, 1, True, SamplingParams(), full_locations=locations)
    plan = offloader.run([row], block_size).plan

    def stage() -> None:
        for p in range(len(manifest.partitions)):
            offloader.stage(p, plan)

    def unstage() -> None:
        for p in range(len(manifest.partitions)):
            offloader.unstage(p, plan)

    stage_s, unstage_s = (timed(fn, config.repeat) / len(full) for fn in (stage, unstage))
    host_bytes = in_host * 2 * int(np.prod(buffers.block_shape)) * buffers.dtype.itemsize
    return {
        "stage_ms": 1000 * stage_s,
        "unstage_ms": 1000 * unstage_s,
        "host_gb": host_bytes / GB,
        "stage_host_gb_per_s": host_bytes / GB / stage_s,
    }


def scatter_session(store: OrtPoolStore, pools: list[Any]) -> Callable[[list[int], np.ndarray], None]:
    """The pager's old device-tier write over the store's `pools` (key, value, key, ... OrtValues),
    for comparison: one ScatterND per pool, outputs bound in place."""
    from onnx import TensorProto

    ort = onnxruntime()
    elem = helper.np_dtype_to_tensor_dtype(store.dtype)
    token = list(store.block_shape[2:])
    nodes, inputs, outputs = [], [helper.make_tensor_value_info("frames", TensorProto.INT64, ["n", 1])], []
    inputs.append(helper.make_tensor_value_info("blocks", elem, ["n", 2 * store.num_layers, *token]))
    for j in range(2 * store.num_layers):
        index = f"i{j}"
        nodes.append(helper.make_node("Constant", [], [index], value=helper.make_tensor(index, TensorProto.INT64, [], [j])))
        nodes.append(helper.make_node("Gather", ["blocks", index], [f"b{j}"], axis=1))
        nodes.append(helper.make_node("ScatterND", [f"pool{j}", "frames", f"b{j}"], [f"out{j}"]))
        inputs.append(helper.make_tensor_value_info(f"pool{j}", elem, ["N", *token]))
        outputs.append(helper.make_tensor_value_info(f"out{j}", elem, ["N", *token]))
    model = helper.make_model(helper.make_graph(nodes, "scatter", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what the CUDA 13 build of ONNX Runtime 1.31 reads
    session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options(1), providers=store.device.providers())

    def write(frames: list[int], data: np.ndarray) -> None:
        binding = session.io_binding()
        binding.bind_cpu_input("frames", np.asarray(frames, np.int64).reshape(-1, 1))
        binding.bind_cpu_input("blocks", np.ascontiguousarray(data).reshape(len(frames), 2 * store.num_layers, *token))
        for j, value in enumerate(pools):
            binding.bind_ortvalue_input(f"pool{j}", value)
            binding.bind_ortvalue_output(f"out{j}", value)
        session.run_with_iobinding(binding)

    return write


def pager_writes(config: Config, manifest: Manifest, num_blocks: int = 64) -> dict[str, dict[str, float]]:
    """Writing `num_blocks` blocks of every full layer into the device tier: put vs ScatterND."""
    device = parse_device(config.device)
    block_size = choose_block_size(manifest, None)
    buffers = KVBuffers(
        manifest, CacheConfig(num_blocks=4 * num_blocks, block_size=block_size), [device] * len(manifest.partitions)
    )
    full = [i for i in range(manifest.config.num_layers) if not manifest.config.is_sliding(i)]
    store = OrtPoolStore([buffers.values(i) for i in full], buffers.dtype, device)
    data = np.ones((num_blocks, *store.block_shape), buffers.dtype)
    scatter = scatter_session(store, [value for i in full for value in buffers.values(i)])
    out = {}
    for layout, frames in (
        ("consecutive", list(range(1, num_blocks + 1))),
        ("every other", list(range(1, 2 * num_blocks + 1, 2))),
    ):
        for name, write in (("put", store.write_many), ("scatternd", scatter)):
            seconds = timed(lambda: write(frames, data), config.repeat)  # noqa: B023 (called at once)
            out[f"{name} {layout}"] = {"ms": 1000 * seconds, "gb_per_s": data.nbytes / GB / seconds}
    return out


def run(config: Config) -> int:
    manifest = Manifest.read(config.model)
    results: dict[str, object] = {}
    print("| context | host tier | host frames | stage ms | unstage ms | host GB | stage GB/s |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for context in config.contexts:
        for pinned in (True, False):
            for scattered in (False, True):
                r = stage_step(config, manifest, context, pinned, scattered)
                kind, layout = "pinned" if pinned else "pageable", "scattered" if scattered else "consecutive"
                results[f"{context} {kind} {layout}"] = r
                print(
                    f"| {context} | {kind} | {layout} | {r['stage_ms']:.2f} | {r['unstage_ms']:.2f} | "
                    f"{r['host_gb']:.3f} | {r['stage_host_gb_per_s']:.1f} |"
                )
    writes = pager_writes(config, manifest)
    print("\n| device-tier write of 64 blocks | ms | GB/s |\n|---|---:|---:|")
    for name, r in writes.items():
        print(f"| {name} | {r['ms']:.2f} | {r['gb_per_s']:.2f} |")
    if config.json_path is not None:
        write_record(config.json_path, config, stage=results, pager_writes=writes)
    return 0


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="an exported WiCore model (its shapes; weights unused)")
    p.add_argument("--contexts", default="8192,32768,131072", help="sequence lengths in tokens")
    p.add_argument("--device-fraction", type=float, default=0.5, help="share of the sequence's blocks on the device")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if not 0 < a.device_fraction < 1 or a.repeat < 1:
        raise SystemExit("error: --device-fraction between 0 and 1, --repeat positive")
    return Config(a.model, int_list(a.contexts), a.device_fraction, a.device, a.repeat, a.json)


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
