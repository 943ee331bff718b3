"""One model over two GPUs: micro-batched steps (both cards busy) against the same split run whole,
and against one card, in one run (issue 34, item 3).

Exports the first `--layers` layers of a Gemma 3 shape (random weights, `--variant`, default 4-bit
weights on the paged attention) as two partitions, then for each concurrency queues that many
requests of `--input-len` random tokens at once and measures:

    prefill s     the requests with one output token each: every prompt prefilled, and the first token
    output tok/s  the same requests with `--output-len` tokens each, to their ends

for: one uncapped card (both partitions on cuda:0, CUDA graphs as the engine chooses); the split
over cuda:0 and cuda:1 run whole (`micro_batch_tokens=0`); the split micro-batched (the default,
512 tokens a micro-batch: prefill steps are cut, decode steps are not); and the split with decode
steps cut too (`--micro-batch-tokens` small). The split runs see `--card-gb` of each card: the rest
is taken by a torch allocation first (the design documents' two 16 GB cards).

    PYTHONPATH=/tmp/site:.:tools python3 tools/bench_pipeline_gpu.py --layers 16 --streams 16,32 \\
        --work /tmp/pipe --json pipeline.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import int_list, write_record
from shape_exports import VARIANTS, export, make_checkpoints

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.types.sampling import SamplingParams

GIB = 1 << 30


@dataclass(frozen=True)
class Config:
    shape: str
    layers: int
    variant: str
    streams: tuple[int, ...]
    input_len: int
    output_len: int
    card_gb: float
    kv_pool_gb: float
    cut_decode_tokens: int
    work: Path
    json_path: Path | None


# name: (devices, micro_batch_tokens, capped)
SETUPS: dict[str, tuple[str, int | None, bool]] = {
    "one card": ("cuda:0", None, False),
    "split, whole steps": ("cuda:0,cuda:1", 0, True),
    "split, micro-batched": ("cuda:0,cuda:1", None, True),
}


def cap_cards(card_gb: float) -> list[object]:
    """Take all but `card_gb` of each card's free memory with a torch allocation (kept alive)."""
    import torch

    held = []
    for i in range(torch.cuda.device_count()):
        free, _ = torch.cuda.mem_get_info(i)
        take = free - int(card_gb * GIB)
        if take > 0:
            held.append(torch.empty(take, dtype=torch.uint8, device=f"cuda:{i}"))
    return held


def measure(model_dir: Path, devices: str, micro: int | None, streams: int, config: Config, capped: bool) -> dict[str, float]:
    held = cap_cards(config.card_gb) if capped else []
    engine_config = EngineConfig(
        model_dir=model_dir,
        devices=devices,
        kv_pool_gb=config.kv_pool_gb,
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,
        micro_batch_tokens=micro,
        scheduler=SchedulerConfig(max_num_seqs=streams, max_context=config.input_len + config.output_len + 64),
    )
    rng = np.random.default_rng(streams)
    with Engine(engine_config) as engine:
        vocab = engine.manifest.config.vocab_size
        runs = {}
        for name, tokens in (("warm-up", 2), ("prefill", 1), ("generate", config.output_len)):
            prompts = [rng.integers(1000, vocab, config.input_len).tolist() for _ in range(streams)]
            params = SamplingParams(max_tokens=tokens, ignore_eos=True)
            start = time.perf_counter()
            done = engine.generate(prompts, params)
            runs[name] = (time.perf_counter() - start, sum(len(c.token_ids) for c in done))
        pipeline = engine.core.runner.graphs.pipeline
        cut = pipeline.num_steps if pipeline is not None else 0
    del held
    seconds, tokens = runs["generate"]
    return {"prefill_s": runs["prefill"][0], "output_tok_s": tokens / seconds, "generate_s": seconds, "cut_steps": cut}


def run(config: Config) -> int:
    folder = make_checkpoints(config.shape, (1, config.layers), config.work)[config.layers]
    model_dir = export(folder, config.variant, config.work / f"{config.shape}-{config.layers}-{config.variant}-2p", partitions=2)
    setups = dict(SETUPS)
    setups[f"split, decode cut too ({config.cut_decode_tokens} tokens)"] = ("cuda:0,cuda:1", config.cut_decode_tokens, True)
    results: dict[str, dict[int, dict[str, float]]] = {}
    spawn = multiprocessing.get_context("spawn")  # a process a point: each starts with whole cards (ORT keeps its arenas)
    for name, (devices, micro, capped) in setups.items():
        results[name] = {}
        for streams in config.streams:
            with ProcessPoolExecutor(1, mp_context=spawn) as child:
                r = child.submit(measure, model_dir, devices, micro, streams, config, capped).result()
            results[name][streams] = r
            print(
                f"{name:40s} {streams:3d} streams: prefill {r['prefill_s']:.3f} s, output {r['output_tok_s']:.1f} tok/s "
                f"({r['cut_steps']} steps cut)",
                flush=True,
            )
    base = "split, whole steps"
    for streams in config.streams:
        for name in results:
            r, b = results[name][streams], results[base][streams]
            print(
                f"{streams:3d} streams, {name:40s}: prefill {b['prefill_s'] / r['prefill_s']:.2f}x, "
                f"output tok/s {r['output_tok_s'] / b['output_tok_s']:.2f}x the whole-step split"
            )
    if config.json_path is not None:
        write_record(config.json_path, config, results=results)
    return 0


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--variant", default="int4-paged", choices=sorted(VARIANTS))
    p.add_argument("--streams", default="16,32")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--card-gb", type=float, default=16.0, help="memory each card keeps for the split runs")
    p.add_argument("--kv-pool-gb", type=float, default=4.0, help="the KV pool, over both cards in a split")
    p.add_argument("--cut-decode-tokens", type=int, default=16, help="micro-batch tokens of the run that cuts decode steps")
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-pipeline"))
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    return Config(
        a.shape, a.layers, a.variant, int_list(a.streams), a.input_len, a.output_len, a.card_gb, a.kv_pool_gb, a.cut_decode_tokens,
        a.work, a.json,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
