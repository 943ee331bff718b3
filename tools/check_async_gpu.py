"""Async scheduling on a GPU: the tokens of `--async-scheduling` against those without, on one export,
the same requests, CUDA graphs on (tests/engine/test_async_scheduling.py checks the same on the CPU).

Half the requests are greedy (the graph's argmax), half sample the whole tempered distribution with
a seed (the sampling head's draw, on an export that has one): under async scheduling both kinds
run their decode rows fed from the step before. Two workloads: every request of one length (the
steps' rows are the same with and without the flag), then lengths that differ, so that requests end
at different steps and a row runs one step past each end, dropped; a step then has more rows than
without the flag, and may take a larger CUDA graph bucket, whose kernels round differently (with
random weights, a sampled token moves with the last bits of the logits). Prints each workload's
differing requests (greedy or sampled, where they part); exits 1 if the equal-length one differs.

    PYTHONPATH=. python3 tools/check_async_gpu.py --model M [--requests 48] [--input-len 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from wicore.engine.config import EngineConfig
from wicore.engine.core import EngineCore
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams


def generate(model: Path, on: bool, prompts: list[list[int]], params: list[SamplingParams], args) -> list[list[int]]:
    """Every request added before the first step of a core stepped here (Engine.generate hands them
    to its thread over several steps, so the batches, and their rounding, would differ run to run)."""
    config = EngineConfig(
        model_dir=model,
        devices=args.device,
        cuda_graphs=True if args.device.startswith("cuda") else None,
        block_size=args.block_size,
        kv_pool_gb=args.kv_pool_gb,
        verify_files=False,
        async_scheduling=on,
    )
    core = EngineCore(config)
    try:
        for i, (ids, p) in enumerate(zip(prompts, params)):
            core.add(core.make_request(ids, p, str(i)))
        start = time.perf_counter()
        tokens: list[list[int]] = [[] for _ in prompts]
        for out in core.run_to_end():
            tokens[int(out.request_id)] += out.new_token_ids
        seconds = time.perf_counter() - start
        steps = core.num_steps
    finally:
        core.close()
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
    failed = False
    for name, length in (("equal lengths", lambda i: 40), ("lengths that differ", lambda i: 8 + 5 * (i % 7))):
        params = [
            SamplingParams(max_tokens=length(i), ignore_eos=True)
            if i % 2 == 0
            else SamplingParams(max_tokens=length(i), temperature=0.8, seed=i, ignore_eos=True)
            for i in range(args.requests)
        ]
        print(f"== {name}", flush=True)
        plain = generate(args.model, False, prompts, params, args)
        ahead = generate(args.model, True, prompts, params, args)
        differ = [i for i, (a, b) in enumerate(zip(plain, ahead)) if a != b]
        print(f"requests whose tokens differ: {len(differ)} of {args.requests}")
        for i in differ:
            at = next((k for k, (a, b) in enumerate(zip(plain[i], ahead[i])) if a != b), min(len(plain[i]), len(ahead[i])))
            kind = "greedy" if i % 2 == 0 else "sampled"
            print(f"  request {i} ({kind}, {len(plain[i])} / {len(ahead[i])} tokens): first differs at token {at}")
        failed |= bool(differ) and name == "equal lengths"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
