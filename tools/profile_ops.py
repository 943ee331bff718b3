"""Per-op time of an export's decode step on one device, from ONNX Runtime's profiler (issue 34).

The same decode steps as profile_step.py (`--batch` rows of `--context` random prompt tokens
prefilled through the engine's core, then 3 warm-up and `--steps` timed decode steps; the graphs run
twice a timed step, both runs counted), with ONNX Runtime's profiler on in every partition's session
and graph capture off (a replayed graph has no node events). For each batch size, a graph run's:

    ops      calls, µs and share of the run's wall time (model_run) per op type, then the slowest
             --top nodes, and what the kernels leave of the run (on a GPU EP: mostly the wait for it)
    copies   the MemcpyFromHost / MemcpyToHost nodes ONNX Runtime inserted: count, bytes, host µs

Which clock the table reads is printed above it (op_profile.py says how each is found):

    gpu      GPU kernel events: a CUDA build with CUPTI profiling ("Kernel"), or a WebGPU EP that
             hands ONNX Runtime its timestamp-query profiler ("Api" events with a cache_key)
    host     the node events: the host's time in each kernel call. The CPU EP's work; on the CUDA
             and WebGPU EPs the launch or recording of the work, which the GPU runs later

The onnxruntime-ep-webgpu 0.4.0 plugin under onnxruntime 1.32 gives host times only: its OrtEp sets
no CreateProfiler, so its WebGpuContext's timestamp queries never start (docs/PERFORMANCE.md).
`--cuts LAYER` then times that layer by wall clock instead, GPU included: the layer's nodes cut short
at each value its main chain passes through, a session each, fed what the layer reads from before it
and run on the last step's rows and KV (prefix_cuts.py); segment = median run to its cut less the
one to the cut before.

Usage (from the repository root; WebGPU without a GPU: ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1):
    PYTHONPATH=. python tools/profile_ops.py --model-dir /tmp/wf/gemma3-1b-8l-fp16-webgpu+paged --devices webgpu
    PYTHONPATH=. python tools/profile_ops.py --model-dir /tmp/g3-fp16 --devices cuda:0 --batch 1,8 --json ops.json
    PYTHONPATH=. python tools/profile_ops.py --model-dir DIR --devices webgpu --batch 1 --cuts 2   # layer 2's segments
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchlib import int_list, run_tool, write_record
from op_profile import OpTable, format_table, op_table
from prefix_cuts import CutTimes, format_cuts, time_cuts
from step_timing import Config, decode_steps, engine_config

from wicore.engine.engine import Engine
from wicore.executor.batch import build_batch

DEFAULT_TOP = 12


@dataclass(frozen=True)
class OpsConfig:
    steps: Config  # the decode steps (step_timing.py), its json_path unused
    top: int  # slowest nodes listed
    json_path: Path | None
    cut_layer: int | None = None  # --cuts: the layer whose segments are timed (prefix_cuts.py)
    num_cut_reps: int = 10

    @property
    def threads(self) -> int:
        return self.steps.threads


def profile_batch(model_dir: Path, config: Config, batch: int) -> tuple[dict[str, object], OpTable]:
    """(what ran, the op table) of `batch` rows' timed decode steps, profiled."""
    with tempfile.TemporaryDirectory(prefix="wicore-ops-") as folder:
        with Engine(engine_config(model_dir, batch, config, f"{folder}/b{batch}")) as engine:
            times = decode_steps(engine, batch, config)
            paths = [Path(s.end_profiling()) for s in engine.core.runner.graphs.sessions]
            info = {
                "model": str(model_dir),
                "flavour": engine.manifest.op_flavour,
                "attention": engine.manifest.attention,
                "devices": ",".join(d.label for d in engine.devices),
                "batch": batch,
                "profiled_graphs_ms": 1000 * statistics.median(times.graphs_seconds),
            }
        profiles = [json.loads(p.read_text()) for p in paths]
    return info, op_table(profiles, 2 * config.num_steps)


def cut_batch(model_dir: Path, config: Config, batch: int, layer: int, num_reps: int) -> CutTimes:
    """The times of `layer`'s segments in `batch` rows' decode step (prefix_cuts.py), in an engine
    not profiled, on its last decode step's rows and KV."""
    with Engine(engine_config(model_dir, batch, config)) as engine:
        decode_steps(engine, batch, config)
        rows = build_batch(list(engine.core.last_step.rows), engine.layout.block_size)
        model = model_dir / engine.manifest.partitions[0].file
        return time_cuts(engine.core.runner.graphs, model, rows, layer, config.threads, num_reps)


def parse_args(argv) -> OpsConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, type=Path, help="exported model")
    parser.add_argument("--devices", default="cpu", help="as wicore's --devices: cpu, cuda:0, webgpu (default cpu)")
    parser.add_argument("--batch", default="1,8", help="batch sizes (rows decoding together; default 1,8)")
    parser.add_argument("--context", type=int, default=160, help="prompt tokens of each row: where its decoding starts")
    parser.add_argument("--steps", type=int, default=5, help="timed decode steps per batch size (default 5)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=None, help="KV block (page) size in tokens (default: the engine's)")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"slowest nodes listed (default {DEFAULT_TOP})")
    parser.add_argument("--cuts", type=int, default=None, metavar="LAYER", help="also time LAYER's segments (prefix_cuts.py)")
    parser.add_argument("--cut-reps", type=int, default=10, help="timed runs of each cut graph (default 10)")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    if args.top < 0 or (args.cuts or 0) < 0 or args.cut_reps < 1:
        raise ValueError("--top and --cuts must be >= 0, --cut-reps >= 1")
    steps = Config(
        (str(args.model_dir),),
        int_list(args.batch),
        args.context,
        args.threads,
        args.steps,
        args.devices,
        profile=True,
        json_path=None,
        block_size=args.block_size,
        cuda_graphs=False,
    )
    return OpsConfig(steps, args.top, args.json, args.cuts, args.cut_reps)


def run(config: OpsConfig, num_busy_before: float | None) -> int:
    model_dir = Path(config.steps.model_dirs[0])
    results = []
    for batch in config.steps.batches:
        info, table = profile_batch(model_dir, config.steps, batch)
        title = f"{info['model']} ({info['flavour']}, {info['attention']} attention) on {info['devices']}, batch {batch}"
        print(format_table(title, table, config.top))
        results.append({**info, **table.to_json()})
        if config.cut_layer is not None:
            cuts = cut_batch(model_dir, config.steps, batch, config.cut_layer, config.num_cut_reps)
            print(format_cuts(title, cuts, config.top))
            results[-1]["cuts"] = cuts.to_json()
    if config.json_path is not None:
        write_record(config.json_path, config, num_busy_cores_before=num_busy_before, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
