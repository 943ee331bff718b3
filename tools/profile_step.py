"""Time one decode step of an exported model at several batch sizes, and where its kernel time goes.

Each row decodes one token at position --context of its own sequence (its blocks hold zeros:
the cost of a step does not depend on the values). Steps run through WiCore's ModelRunner,
as the engine runs them (IOBinding, pools bound in place), on the CPU EP with --threads.

    step ms      median over --steps timed steps, after 3 warm-up steps
    tok/s        batch / step time: the decode rate of that many streams, prefills aside
    --profile    ONNX Runtime's profiler on separate runs: kernel time per op type, the top ones

Usage (from the repository root):
    PYTHONPATH=. python tools/profile_step.py --model-dir models/gemma3-270m-quant --batch 1,16 --profile
    PYTHONPATH=. python tools/profile_step.py --model-dir OLD --model-dir NEW --batch 1,16   # compare exports
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchlib import int_list, run_tool, write_record

from wicore.graph.manifest import Manifest
from wicore.runtime.session import CacheConfig, ModelRunner, build_step

BLOCK_SIZE = 16
TOP_OPS = 8


@dataclass(frozen=True)
class Row:
    """A decode row of wicore.runtime.session.StepRow: one token at `start`, blocks of its own."""

    token_ids: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]
    window_table: tuple[int, ...]
    window_first: int = 0
    needs_logits: bool = True


@dataclass(frozen=True)
class Config:
    model_dirs: tuple[str, ...]
    batches: tuple[int, ...]
    context: int
    threads: int
    num_steps: int
    profile: bool
    json_path: Path | None


def num_blocks(batch: int, context: int) -> int:
    """The sink and, for each row, the blocks of `context` tokens plus the one decoded."""
    return 1 + batch * (context // BLOCK_SIZE + 1)


def decode_rows(batch: int, context: int) -> list[Row]:
    per_row = context // BLOCK_SIZE + 1
    rows = []
    for r in range(batch):
        table = tuple(1 + r * per_row + b for b in range(per_row))  # block 0 is the sink
        rows.append(Row((100,), context, table, table))
    return rows


def measure(model_dir: Path, config: Config) -> list[dict[str, object]]:
    manifest = Manifest.read(model_dir)
    cache = CacheConfig(num_blocks(max(config.batches), config.context), BLOCK_SIZE)
    runner = ModelRunner(model_dir, manifest, cache, config.threads)
    records = []
    for batch in config.batches:
        step = build_step(decode_rows(batch, config.context), BLOCK_SIZE)
        for _ in range(3):
            runner.run(step)
        times = []
        for _ in range(config.num_steps):
            start = time.perf_counter()
            runner.run(step)
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times)
        records.append({"model": str(model_dir), "flavour": manifest.op_flavour, "batch": batch, "step_ms": ms,
                        "tokens_per_s": batch / ms * 1000})
    return records


def profile(model_dir: Path, config: Config, batch: int) -> Counter:
    """Kernel microseconds per op type, summed over all partitions, per step."""
    cache = CacheConfig(num_blocks(batch, config.context), BLOCK_SIZE)
    runner = ModelRunner(model_dir, Manifest.read(model_dir), cache, config.threads,
                         profile_prefix=f"/tmp/wicore-profile-{batch}")
    step = build_step(decode_rows(batch, config.context), BLOCK_SIZE)
    for _ in range(config.num_steps):
        runner.run(step)
    per_op: Counter = Counter()
    for s in runner.sessions:
        path = Path(s.end_profiling())
        for event in json.loads(path.read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                per_op[event["args"]["op_name"]] += event["dur"] / config.num_steps
        path.unlink()
    return per_op


def parse_args(argv) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", action="append", required=True, help="exported model; repeat to compare")
    parser.add_argument("--batch", default="1,16", help="batch sizes (rows decoding together)")
    parser.add_argument("--context", type=int, default=160, help="tokens each row already has in its cache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per batch size")
    parser.add_argument("--profile", action="store_true", help="also break kernel time down by op type")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return Config(tuple(str(m) for m in args.model_dir), int_list(args.batch), args.context, args.threads, args.steps, args.profile, args.json)


def run(config: Config, num_busy_before: float | None) -> int:
    records, profiles = [], {}
    for model_dir in config.model_dirs:  # alternate models per batch size would be fairer; runs are short
        records += measure(Path(model_dir), config)
        if config.profile:
            profiles[model_dir] = {b: profile(Path(model_dir), config, b) for b in config.batches}
    print(f"decode step, context {config.context}, {config.threads} threads, median of {config.num_steps}\n")
    print("| model | flavour | batch | step ms | tok/s |\n|---|---|---:|---:|---:|")
    for r in records:
        print(f"| {r['model']} | {r['flavour']} | {r['batch']} | {r['step_ms']:.2f} | {r['tokens_per_s']:.1f} |")
    for model, by_batch in profiles.items():
        for batch, per_op in by_batch.items():
            total = sum(per_op.values())
            top = ", ".join(f"{op} {us / 1000:.2f}" for op, us in per_op.most_common(TOP_OPS))
            print(f"\n{model}, batch {batch}: kernels {total / 1000:.2f} ms a step (profiled); ms by op: {top}")
    if config.json_path is not None:
        write_record(config.json_path, config, num_busy_cores_before=num_busy_before, results=records,
                     profiles={m: {b: dict(p) for b, p in bb.items()} for m, bb in profiles.items()})
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
