"""KV cache bytes per token of one long request, with the sliding layers' blocks released.

Runs one request of `--context` prompt tokens (plus a few generated) through the engine on
the real Gemma 3 270M and reads, while it decodes, how many blocks each group holds:

    full group:   every block of the context (the full-attention layers)
    window group: the blocks the sliding layers still see (their window plus one block)

    bytes/token after  = (full blocks * full block bytes + window blocks * window block bytes) / tokens
    bytes/token before = full blocks * (full + window block bytes) / tokens   (every layer keeps every block)

    python tools/bench_kv_memory.py --context 8192 [--model-dir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from wicore.cli.models import resolve_model
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.types.sampling import SamplingParams


def measure(model_dir: Path, context: int, new_tokens: int, threads: int, kv_pool_gb: float) -> dict[str, object]:
    rng = np.random.default_rng(0)
    prompt = rng.integers(1000, 200_000, context - new_tokens).tolist()
    config = EngineConfig(
        model_dir=model_dir,
        num_threads=threads,
        kv_pool_gb=kv_pool_gb,
        host_tier_gb=0.0,
        scheduler=SchedulerConfig(max_num_seqs=1, max_context=context + 1),
    )
    seen = []
    start = time.perf_counter()
    with Engine(config).start() as engine:
        request_id = engine.add_request(prompt, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        for _ in engine.outputs(request_id):
            seen.append(engine.stats().kv_groups)  # after each token: the request holds its blocks
    seconds = time.perf_counter() - start
    groups = seen[-2]  # before the last output ended the request
    full, window = groups["full"], groups["window"]
    num_full, num_window = full.blocks_referenced.device, window.blocks_referenced.device
    tokens = context - 1  # KV written: all but the last generated token
    after = (num_full * full.block_bytes + num_window * window.block_bytes) / tokens
    before = num_full * (full.block_bytes + window.block_bytes) / tokens
    return {
        "context_tokens": context,
        "full_blocks": num_full,
        "window_blocks": num_window,
        "full_block_bytes": full.block_bytes,
        "window_block_bytes": window.block_bytes,
        "bytes_per_token_before": round(before),
        "bytes_per_token_after": round(after),
        "reduction": round(before / after, 2),
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default="gemma3-270m", help="exported model folder, or gemma3-270m (exported once, cached)")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-pool-gb", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = measure(resolve_model(args.model_dir), args.context, args.new_tokens, args.threads, args.kv_pool_gb)
    result["command"] = " ".join(["python", "tools/bench_kv_memory.py", *(argv if argv is not None else sys.argv[1:])])
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
