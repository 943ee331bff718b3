"""Time decode steps of an exported model at several batch sizes, and where their kernel time goes.

Steps run through the engine's core (`EngineCore.step()`), without the engine's thread.
`--batch` requests of `--context` prompt tokens each are prefilled; then every step is a real
decode step (one new token a row, at positions --context, --context + 1, ...) on the rows the
engine's scheduler produced, so block tables and sliding-window tables (the blocks behind the
window released) are the engine's:

    core.step()                             step ms   its runner phase (core.last_step): graphs and sampling
    graphs.run(build_batch(step's rows))    graphs ms the ONNX Runtime sessions alone, on the same rows

(The graphs run twice a step; the second run writes the same KV again.)

    step ms      median over --steps timed steps, after 3 warm-up steps
    tok/s        batch / step time: the decode rate of that many streams, prefills aside
    --profile    ONNX Runtime's profiler on, in a second engine run the same way: kernel time
                 per op type over the timed steps' graph runs (prefill and warm-up left out).
                 On the CUDA EP these are the host's times to launch each node, not GPU time.
    --gpu-kernels  GPU time per kernel over 4 more engine steps, from CUPTI through torch's
                 profiler (CUDA EP; torch installed): busy ms a step beside the step's wall
                 time is what the host leaves the GPU idle.

Usage (from the repository root):
    PYTHONPATH=. python tools/profile_step.py --model-dir models/gemma3-270m-quant --batch 1,16 --profile
    PYTHONPATH=. python tools/profile_step.py --model-dir OLD --model-dir NEW --batch 1,16   # compare exports
    PYTHONPATH=. python tools/profile_step.py --model-dir /tmp/g3-fp16 --devices cuda:0 --batch 1,8,32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchlib import int_list, run_tool, write_record
from step_timing import Config, decode_steps, engine_config

from wicore.cli.engine_args import SWITCH, add_switch
from wicore.engine.engine import Engine

TOP_OPS = 8
KERNEL_STEPS = 4  # --gpu-kernels: engine steps profiled (after the timed ones: within NUM_SPARE_TOKENS)


def measure(model_dir: Path, config: Config) -> list[dict[str, object]]:
    records = []
    for batch in config.batches:
        with Engine(engine_config(model_dir, batch, config)) as engine:
            times = decode_steps(engine, batch, config)
            flavour = engine.manifest.op_flavour
            devices = ",".join(d.label for d in engine.devices)
            captured = bool(engine.config.cuda_graphs)
        ms = 1000 * statistics.median(times.step_seconds)
        records.append(
            {
                "model": str(model_dir),
                "flavour": flavour,
                "devices": devices,
                "captured": captured,
                "batch": batch,
                "step_ms": ms,
                "graphs_ms": 1000 * statistics.median(times.graphs_seconds),
                "tokens_per_s": batch / ms * 1000,
            }
        )
    return records


def profile(model_dir: Path, config: Config, batch: int) -> Counter:
    """Kernel microseconds per op type, summed over all partitions, per graph run of the timed
    steps: a session's last 2 * --steps runs (`model_run` events), the node events inside them."""
    num_runs = 2 * config.num_steps
    per_op: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix="wicore-profile-") as folder:
        with Engine(engine_config(model_dir, batch, config, f"{folder}/b{batch}")) as engine:
            decode_steps(engine, batch, config)
            paths = [Path(s.end_profiling()) for s in engine.core.runner.graphs.sessions]
        for path in paths:
            events = json.loads(path.read_text())
            runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[-num_runs:]
            for event in events:
                is_kernel = event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                if is_kernel and any(first <= event["ts"] <= last for first, last in runs):
                    per_op[event["args"]["op_name"]] += event["dur"] / num_runs
    return per_op


def gpu_kernels(model_dir: Path, config: Config, batch: int) -> tuple[float, Counter]:
    """(wall ms, {kernel: GPU µs}) a decode step, over KERNEL_STEPS engine steps after the timed
    ones. CUPTI (through torch's profiler) sees every kernel of the process, ONNX Runtime's too."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: --gpu-kernels needs torch with CUDA (it reads CUPTI through torch's profiler)")
    per_kernel: Counter = Counter()
    with Engine(engine_config(model_dir, batch, config)) as engine:
        decode_steps(engine, batch, config)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(KERNEL_STEPS):
                engine.core.step()
            wall_ms = 1000 * (time.perf_counter() - start) / KERNEL_STEPS
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            per_kernel[event.key[:70]] += event.self_device_time_total / KERNEL_STEPS
    return wall_ms, per_kernel


def parse_args(argv) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", action="append", required=True, help="exported model; repeat to compare")
    parser.add_argument("--batch", default="1,16", help="batch sizes (rows decoding together)")
    parser.add_argument("--context", type=int, default=160, help="prompt tokens of each row: where its decoding starts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per batch size")
    parser.add_argument("--devices", default="cpu", help="as wicore's --devices: cpu, cuda:0, cuda:0,cpu, ... (default cpu)")
    parser.add_argument("--profile", action="store_true", help="also break kernel time down by op type")
    parser.add_argument("--gpu-kernels", action="store_true", help="also GPU time per kernel (CUDA; needs torch)")
    parser.add_argument("--block-size", type=int, default=None, help="KV block (page) size in tokens (default: the engine's)")
    add_switch(
        parser,
        "--cuda-graphs",
        "decode steps replayed from captured graphs (EngineConfig.cuda_graphs: CUDA graphs, or the WebGPU EP's)",
    )
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return Config(
        tuple(str(m) for m in args.model_dir),
        int_list(args.batch),
        args.context,
        args.threads,
        args.steps,
        args.devices,
        args.profile,
        args.json,
        args.gpu_kernels,
        args.block_size,
        cuda_graphs=SWITCH[args.cuda_graphs],
    )


def run(config: Config, num_busy_before: float | None) -> int:
    records, profiles, kernels = [], {}, {}
    for model_dir in config.model_dirs:  # alternate models per batch size would be fairer; runs are short
        records += measure(Path(model_dir), config)
        if config.profile:
            profiles[model_dir] = {b: profile(Path(model_dir), config, b) for b in config.batches}
        if config.gpu_kernels:
            kernels[model_dir] = {b: gpu_kernels(Path(model_dir), config, b) for b in config.batches}
    print(f"decode steps from context {config.context}, {config.threads} threads, median of {config.num_steps}\n")
    print("| model | flavour | devices | captured | batch | step ms | graphs ms | tok/s |\n|---|---|---|---|---:|---:|---:|---:|")
    for r in records:
        print(
            f"| {r['model']} | {r['flavour']} | {r['devices']} | {r['captured']} | {r['batch']} | {r['step_ms']:.2f} | "
            f"{r['graphs_ms']:.2f} | {r['tokens_per_s']:.1f} |"
        )
    for model, by_batch in profiles.items():
        for batch, per_op in by_batch.items():
            total = sum(per_op.values())
            top = ", ".join(f"{op} {us / 1000:.2f}" for op, us in per_op.most_common(TOP_OPS))
            print(f"\n{model}, batch {batch}: kernels {total / 1000:.2f} ms a graph run (profiled); ms by op: {top}")
    for model, by_batch in kernels.items():
        for batch, (wall_ms, per_kernel) in by_batch.items():
            busy = sum(per_kernel.values()) / 1000
            print(f"\n{model}, batch {batch}: GPU busy {busy:.2f} of {wall_ms:.2f} ms a step; ms by kernel:")
            for name, us in per_kernel.most_common(2 * TOP_OPS):
                print(f"  {us / 1000:7.3f}  {name}")
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            results=records,
            profiles={m: {b: dict(p) for b, p in bb.items()} for m, bb in profiles.items()},
            gpu_kernels={m: {b: {"wall_ms": w, "kernels_us": dict(k)} for b, (w, k) in bb.items()} for m, bb in kernels.items()},
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
