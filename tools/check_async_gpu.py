"""Async scheduling on a GPU: the tokens of `--async-scheduling` against those without, on one export,
the same requests, CUDA graphs on (tests/engine/test_async_scheduling.py checks the same on the CPU).

Half the requests are greedy (the graph's argmax), half sample the whole tempered distribution with
a seed (the sampling head's draw, on an export that has one): under async scheduling both kinds
run their decode rows fed from the step before. Their lengths differ, so requests end at different
steps and the rows that run one step past a request's end are dropped. Prints one line a setting
and the number of requests whose tokens differ; exits 1 if any does.

    PYTHONPATH=. python3 tools/check_async_gpu.py --model M [--requests 48] [--input-len 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from wicore.engine.config import EngineConfig
from wicore.engine.engine import Engine
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams


def generate(model: Path, on: bool, prompts: list[list[int]], params: list[SamplingParams], args) -> list[list[int]]:
    config = EngineConfig(
        model_dir=model,
        devices=args.device,
        cuda_graphs=True if args.device.startswith("cuda") else None,
        block_size=args.block_size,
        kv_pool_gb=args.kv_pool_gb,
        verify_files=False,
        async_scheduling=on,
    )
    with Engine(config) as engine:
        start = time.perf_counter()
        completions = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
        steps = engine.num_steps
    tokens = [c.token_ids for c in completions]
    print(f"async_scheduling={on}: {sum(map(len, tokens))} tokens in {seconds:.2f} s, {steps} steps", flush=True)
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--kv-pool-gb", type=float, default=4.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    vocab = Manifest.read(args.model).config.vocab_size
    prompts = [rng.integers(3, vocab, args.input_len).tolist() for _ in range(args.requests)]
    params = [
        SamplingParams(max_tokens=8 + 5 * (i % 7), ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(max_tokens=8 + 5 * (i % 7), temperature=0.8, seed=i, ignore_eos=True)
        for i in range(args.requests)
    ]
    plain = generate(args.model, False, prompts, params, args)
    ahead = generate(args.model, True, prompts, params, args)
    differ = [i for i, (a, b) in enumerate(zip(plain, ahead)) if a != b]
    print(f"requests whose tokens differ: {len(differ)} of {args.requests}" + (f" (first: {differ[0]})" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
