"""Greedy ids of an export with its decode steps captured and without (EngineConfig.cuda_graphs on / off).

Rows of several prompt lengths decode together, first uncaptured, then from the graphs ONNX Runtime
captured (CUDA graphs, or the WebGPU EP's recorded command buffers: docs/HARDWARE.md); the tool
prints whether every row's ids are equal and exits 1 where they are not. The device tier is sized
to the rows (`--blocks`), so the captured tables and the attention's bounds are as narrow as the
rows need.

Usage (from the repository root; on lavapipe with ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1):
    PYTHONPATH=.:tools python tools/check_graph_capture.py --model-dir /tmp/wf/gemma3-1b-8l-fp16-webgpu+paged \
        --devices webgpu --new-tokens 16
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import int_list, run_tool, write_record

from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams


@dataclass(frozen=True)
class Config:
    model_dir: Path
    devices: str
    prompt_lengths: tuple[int, ...]
    new_tokens: int
    num_blocks: int
    block_size: int | None
    threads: int
    json_path: Path | None


def greedy_ids(config: Config, captured: bool) -> list[list[int]]:
    rng = np.random.default_rng(0)
    engine_config = EngineConfig(
        model_dir=config.model_dir,
        devices=config.devices,
        num_threads=config.threads,
        num_device_blocks=config.num_blocks,
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,
        block_size=config.block_size,
        cuda_graphs=captured,
    )
    with Engine(engine_config) as engine:
        if bool(engine.config.cuda_graphs) is not captured:
            raise RuntimeError(f"the engine runs with cuda_graphs={engine.config.cuda_graphs}, asked {captured}")
        vocab = engine.manifest.config.vocab_size
        prompts = [rng.integers(min(1000, vocab // 2), vocab, n).tolist() for n in config.prompt_lengths]
        done = engine.generate(prompts, SamplingParams(max_tokens=config.new_tokens, temperature=0.0, ignore_eos=True))
    errors = [c.error for c in done if c.error]
    if errors:
        raise RuntimeError(f"captured={captured}: {errors[0]}")
    return [c.token_ids for c in done]


def parse_args(argv) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--devices", required=True, help="one device that captures: cuda:0 or webgpu")
    ap.add_argument("--prompt-lengths", default="7,60,300")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=32, help="KV blocks on the device, the sink included")
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    lengths = int_list(a.prompt_lengths)
    return Config(a.model_dir, a.devices, lengths, a.new_tokens, a.blocks, a.block_size, a.threads, a.json)


def run(config: Config, num_busy_before: float | None) -> int:
    ids = {"off": greedy_ids(config, False), "on": greedy_ids(config, True)}
    equal = ids["off"] == ids["on"]
    print(f"{config.model_dir.name} on {config.devices}: greedy ids with and without capture {'EQUAL' if equal else 'DIFFER'}")
    for off, on in zip(ids["off"], ids["on"]):
        print(f"  off {off}\n  on  {on}")
    if config.json_path is not None:
        write_record(config.json_path, config, num_busy_cores_before=num_busy_before, ids=ids, equal=equal)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
