"""One model over two GPUs: the split's ways of keeping both cards busy against the same split run
whole, and against one card, in one run (issue 34, item 3).

Exports the first `--layers` layers of a Gemma 3 shape (random 4-bit weights, no checkpoint:
wicore.export.random_weights) as two partitions, then for each concurrency queues that many
requests of `--input-len` random tokens at once and measures:

    TTFT s        the requests with one output token each: every prompt prefilled, and its first token
                  (the time to the last stream's first token)
    output tok/s  the same requests with `--output-len` tokens each, to their ends; beside it the mean
                  time to a request's first token in that run

for: one uncapped card (both partitions on cuda:0, CUDA graphs as the engine chooses); the split
over cuda:0 and cuda:1 run whole (`micro_batch_tokens=0`, `pipeline_groups=1`); the split
micro-batched (512 tokens a micro-batch: prefill steps are cut, decode steps are not); the split
with two steps in flight over two groups of requests (`pipeline_groups=2`, wicore.engine.groups,
prefill steps cut too); the split with CUDA graphs per partition (experimental,
WICORE_SPLIT_CUDA_GRAPHS: whole steps, or groups with the hidden states handed card to card by a
session or through the host); and, with `--cut-decode-tokens N`, the split with decode steps cut too.
Each setup's generated tokens are compared with the uncaptured splits' and one card's (same prompts):
the count of requests with equal tokens is printed and recorded.
The split runs see `--card-gb` of each card: the rest is taken by a torch allocation first (the
design documents' two 16 GB cards). A process a setup, its stream counts in the order given.

    PYTHONPATH=/tmp/site:.:tools python3 tools/bench_pipeline_gpu.py --layers 8 --streams 32,16 \\
        --work /tmp/pipe --json pipeline.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import int_list, write_record
from shape_exports import split_quant_export

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.executor.graphs import SPLIT_GRAPHS_ENV
from wicore.types.sampling import SamplingParams

GIB = 1 << 30


@dataclass(frozen=True)
class Config:
    shape: str
    layers: int
    bits: int
    streams: tuple[int, ...]
    input_len: int
    output_len: int
    card_gb: float
    kv_pool_gb: float
    cut_decode_tokens: int
    setups: tuple[str, ...]
    work: Path
    json_path: Path | None


@dataclass(frozen=True)
class Setup:
    devices: str
    micro_batch_tokens: int | None
    pipeline_groups: int
    capped: bool  # each card held to card_gb
    cuda_graphs: bool | None = False  # None: as the engine chooses (on for a paged export on one CUDA card)
    handoff: str | None = None  # WICORE_SPLIT_CUDA_GRAPHS: CUDA graphs over the two cards, hidden states via "device" or "host"


SETUPS: dict[str, Setup] = {
    "split, groups in flight": Setup("cuda:0,cuda:1", None, 2, True),
    "split, whole steps": Setup("cuda:0,cuda:1", 0, 1, True),
    "split, micro-batched": Setup("cuda:0,cuda:1", None, 1, True),
    "split, groups + CUDA graphs": Setup("cuda:0,cuda:1", None, 2, True, True, "device"),
    "split, groups + CUDA graphs, via host": Setup("cuda:0,cuda:1", None, 2, True, True, "host"),
    "split, whole steps + CUDA graphs": Setup("cuda:0,cuda:1", 0, 1, True, True, "device"),
    "one card": Setup("cuda:0", None, 1, False, None),
}
TOKENS_PEERS = ("split, whole steps", "split, groups in flight", "one card")  # each setup's tokens are compared with these


def export(config: Config) -> Path:
    """The bench's model: shape_exports.split_quant_export of the configured shape, layers and bits."""
    return split_quant_export(config.shape, config.layers, config.bits, config.work)


def cap_cards(card_gb: float) -> list[object]:
    """Take all but `card_gb` of each card's free memory with a torch allocation (kept alive)."""
    import torch

    held: list[object] = []
    for i in range(torch.cuda.device_count()):
        free, _ = torch.cuda.mem_get_info(i)
        take = free - int(card_gb * GIB)
        if take > 0:
            held.append(torch.empty(take, dtype=torch.uint8, device=f"cuda:{i}"))
    return held


def timed_generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, float, list[list[int]]]:
    """Queue every prompt at once: (seconds to the last end, tokens out, mean seconds to a first
    token, each prompt's tokens)."""
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    engine.start()
    first: list[float] = []
    tokens: dict[str, list[int]] = {}

    def follow(request_id: str) -> None:
        got = tokens.setdefault(request_id, [])
        for out in engine.outputs(request_id):
            if out.new_token_ids and not got:
                first.append(time.perf_counter() - start)
            got += out.new_token_ids

    threads = [threading.Thread(target=follow, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    return seconds, sum(len(t) for t in tokens.values()), float(np.mean(first)), [tokens[i] for i in ids]


def measure(model_dir: Path, setup: Setup, config: Config) -> dict[int, dict[str, object]]:
    """Every stream count of `config` on one engine (its own process): the points by stream count
    (with the generated tokens, under "tokens")."""
    held = cap_cards(config.card_gb) if setup.capped else []
    if setup.handoff is not None:  # this setup's own process
        os.environ[SPLIT_GRAPHS_ENV] = setup.handoff
    engine_config = EngineConfig(
        model_dir=model_dir,
        devices=setup.devices,
        kv_pool_gb=config.kv_pool_gb,
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,
        micro_batch_tokens=setup.micro_batch_tokens,
        pipeline_groups=setup.pipeline_groups,
        cuda_graphs=setup.cuda_graphs,
        scheduler=SchedulerConfig(max_num_seqs=max(config.streams), max_context=config.input_len + config.output_len + 64),
    )
    points = {}
    with Engine(engine_config) as engine:
        vocab = engine.manifest.config.vocab_size
        for streams in config.streams:
            rng = np.random.default_rng(streams)
            runs = {}
            for name, tokens in (("warm-up", 2), ("prefill", 1), ("generate", config.output_len)):
                prompts = [rng.integers(1000, vocab, config.input_len).tolist() for _ in range(streams)]
                runs[name] = timed_generate(engine, prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
            seconds, tokens, ttft, generated = runs["generate"]
            points[streams] = {
                "tokens": generated,
                "ttft_s": runs["prefill"][0],
                "output_tok_s": tokens / seconds,
                "generate_s": seconds,
                "generate_mean_ttft_s": ttft,
            }
        pipeline = engine.core.runner.graphs.pipeline
        steps = engine.core.num_steps
        captured = bool(engine.config.cuda_graphs)
        for point in points.values():
            point.update(cut_steps=pipeline.num_steps if pipeline is not None else 0, steps=steps, cuda_graphs=captured)
    del held
    return points


def run(config: Config) -> int:
    model_dir = export(config)
    setups = {name: SETUPS[name] for name in config.setups}
    if config.cut_decode_tokens:
        setups[f"split, decode cut too ({config.cut_decode_tokens} tokens)"] = Setup(
            "cuda:0,cuda:1", config.cut_decode_tokens, 1, True
        )
    results: dict[str, dict[int, dict[str, object]]] = {}
    spawn = multiprocessing.get_context("spawn")  # a process a setup: each starts with whole cards (ORT keeps its arenas)
    for name, setup in setups.items():
        with ProcessPoolExecutor(1, mp_context=spawn) as child:
            try:
                results[name] = child.submit(measure, model_dir, setup, config).result()
            except Exception as exc:  # the other setups still run
                print(f"{name}: failed: {exc!r}", flush=True)
                continue
        for streams, r in results[name].items():
            print(
                f"{name:40s} {streams:3d} streams: TTFT {r['ttft_s']:.3f} s, output {r['output_tok_s']:.1f} tok/s "
                f"(mean TTFT {r['generate_mean_ttft_s']:.3f} s; CUDA graphs {r['cuda_graphs']})",
                flush=True,
            )
        if config.json_path is not None:  # after each setup: a cut-short run keeps what it measured
            write_record(config.json_path, config, results=results)
    for name, points in results.items():
        for streams, r in points.items():
            r["requests_equal_to"] = equal = {  # the same prompts (seeded by the stream count)
                peer: sum(x == y for x, y in zip(r["tokens"], results[peer][streams]["tokens"]))  # type: ignore[call-overload]
                for peer in TOKENS_PEERS
                if peer in results and peer != name
            }
            print(f"{streams:3d} streams, {name:40s}: requests with a peer's tokens, of {streams}: {equal}")
    if config.json_path is not None:
        write_record(config.json_path, config, results=results)
    base = "split, whole steps"
    if base in results:
        for streams in config.streams:
            for name in results:
                r, b = results[name][streams], results[base][streams]
                print(
                    f"{streams:3d} streams, {name:40s}: TTFT {b['ttft_s'] / r['ttft_s']:.2f}x, "  # type: ignore[operator]
                    f"output tok/s {r['output_tok_s'] / b['output_tok_s']:.2f}x the whole-step split"  # type: ignore[operator]
                )
    return 0


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--streams", default="32,16")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--card-gb", type=float, default=16.0, help="memory each card keeps for the split runs")
    p.add_argument("--kv-pool-gb", type=float, default=4.0, help="the KV pool, over both cards in a split")
    p.add_argument(
        "--cut-decode-tokens", type=int, default=0, help="also a run that cuts decode steps (micro-batch tokens; 0: none)"
    )
    p.add_argument("--setups", default=";".join(SETUPS), help=f"which of: {'; '.join(SETUPS)} (';'-separated, in order)")
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-pipeline"))
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    names = tuple(n.strip() for n in a.setups.split(";"))
    unknown = [n for n in names if n not in SETUPS]
    if unknown:
        p.error(f"unknown setup(s) {unknown}: choose from {list(SETUPS)}")
    return Config(
        a.shape, a.layers, a.bits, int_list(a.streams), a.input_len, a.output_len, a.card_gb, a.kv_pool_gb,
        a.cut_decode_tokens, names, a.work, a.json,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
