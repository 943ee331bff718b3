"""Where the engine thread's host work goes at a full batch: the scheduler, the batch, the accounting.

Runs `wicore bench throughput`'s load (`--num-prompts` requests of `--input-len` random prompt tokens
and `--output-len` output tokens, greedy, `ignore_eos`, all queued at once) through an `EngineCore`
stepped by hand, and times the calls each step makes on the engine thread:

    plan_ahead     Scheduler.plan_ahead         the next step's fed rows, planned while one runs (async)
    schedule       Scheduler.schedule           rows, budgets, KV appends
    repeat         Scheduler.repeat_decodes     the steady decode step's rows (not with async scheduling)
    prepare        ModelRunner.prepare          the batch built (into a decode bucket's host side)
    launch         StepWorker.launch            queued on the worker (async)
    finish         ModelRunner.finish           the step's results into per-row results
    drop           Scheduler.drop_cancelled     aborts and deadlines (async)
    update         Scheduler.update             new tokens, stops, KV commits

Steps are classed by the rows the step scheduled: `full` where they are at least `--max-num-seqs` less
16 (the plateau of the run: a prompt or two prefill beside ~256 decodes), `all` every step that ran
rows (the ramp up and down too: what `wicore bench throughput`'s per-step means average over). A line
per class gives each call's mean and median us a step (`--clock cpu`, the default: the engine
thread's CPU time, which other processes' load inflates less; `wall`: wall time); with `--profile N`,
cProfile's top N functions (by own time) over the full steps. `--no-graphs` makes ONNX Runtime's run
a no-op (the sampled ids are then whatever the output buffers hold; every request still runs its
tokens, ignore_eos): the host work alone, undisturbed by the graphs on the other core;
`--decode-graphs` runs decode steps through the CUDA-graph path's buckets (on the CPU EP their
inputs are what runs), as async scheduling prepares them on a GPU.

`--model-dir` is exported first where it holds no model: a tiny random Gemma 3 (hidden 64, 2 layers,
vocabulary 512, context 1,024, a 1,024-token window: the 27B shape's layer kinds, its graphs cheap).

    PYTHONPATH=. python tools/profile_schedule.py --model-dir /tmp/sched-tiny --block-size 128 --decode-graphs --no-graphs
    PYTHONPATH=. python tools/profile_schedule.py --model-dir /tmp/sched-tiny --block-size 128 --no-graphs --profile 30
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import json
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from wicore.engine.core import EngineCore
from wicore.engine.engine import EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.types.sampling import SamplingParams

CALLS = (
    ("plan_ahead", "scheduler", "plan_ahead"),
    ("schedule", "scheduler", "schedule"),
    ("repeat", "scheduler", "repeat_decodes"),
    ("prepare", "runner", "prepare"),
    ("launch", "_worker", "launch"),
    ("finish", "runner", "finish"),
    ("drop", "scheduler", "drop_cancelled"),
    ("update", "scheduler", "update"),
)


FULL_MARGIN = 16  # a step of at least --max-num-seqs less this many rows counts as full


def clock_full(core: EngineCore, full: int) -> bool:
    """Whether the step about to run is likely a full one: as many requests running as a full step's rows."""
    return len(core.scheduler.running) >= full


class StepClock:
    """Seconds in each timed call during the current step, and the rows the step scheduled."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self.timer = timer
        self.seconds: dict[str, float] = defaultdict(float)
        self.num_rows = 0
        self.num_decode_rows = 0

    def wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.timer()
            out = call(*args, **kwargs)
            self.seconds[name] += self.timer() - start
            if name in ("schedule", "repeat") and out is not None:
                self.num_rows += len(out.rows)
                self.num_decode_rows += sum(len(row.token_ids) == 1 for row in out.rows)
            return out

        return timed

    def reset(self) -> None:
        self.seconds = defaultdict(float)
        self.num_rows = self.num_decode_rows = 0


TINY = dict(
    model_type="gemma3_text",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    sliding_window=1024,
    max_position_embeddings=1024,
    query_pre_attn_scalar=32,
    layer_types=["sliding_attention", "full_attention"],
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
)


def export_tiny(model_dir: Path) -> None:
    """The tiny random Gemma 3 (TINY), fp32, into `model_dir`."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.random_weights import RandomFloatSource
    from wicore.model.config import DecoderConfig

    source = RandomFloatSource(DecoderConfig.from_hf(TINY))
    export_model(source, model_dir, ExportConfig(dtype="fp32", overwrite=True), progress=lambda _: None)


def make_core(args: argparse.Namespace) -> EngineCore:
    config = EngineConfig(
        model_dir=args.model_dir,
        num_threads=args.threads,
        block_size=args.block_size,
        kv_pool_gb=args.kv_pool_gb,
        host_tier_gb=0.0,
        verify_files=False,
        async_scheduling=args.async_scheduling == "on",
        steady_decode=not args.no_steady,
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs),
    )
    core = EngineCore(config)
    if args.decode_graphs:
        bs, context = core.layout.block_size, core.max_sequence_tokens
        window = 1
        if core.layout.has_window:
            window = -(-core.manifest.config.sliding_window // bs) + 2
        core.runner.graphs.enable_decode_graphs(bs, args.max_num_seqs, -(-context // bs), window, context)
    return core


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not (args.model_dir / "wicore.json").exists():
        export_tiny(args.model_dir)
    core = make_core(args)
    timer = time.thread_time if args.clock == "cpu" else time.perf_counter
    clock = StepClock(timer)
    gc_started = [0.0]

    def gc_phase(phase: str, info: dict[str, int]) -> None:  # the cyclic GC's passes, on whichever thread
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            clock.seconds[f"gc{info['generation']}"] += time.perf_counter() - gc_started[0]

    gc.callbacks.append(gc_phase)
    for name, owner, attr in CALLS:
        target = getattr(core, owner, None)
        if target is not None:
            setattr(target, attr, clock.wrap(name, getattr(target, attr)))
    if args.no_graphs:
        from onnxruntime.capi import onnxruntime_inference_collection as ort

        ort.InferenceSession.run_with_iobinding = lambda *a, **k: None  # type: ignore[method-assign]
    rng = np.random.default_rng(args.seed)
    vocab = core.manifest.config.vocab_size
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    for i in range(args.num_prompts):
        prompt = rng.integers(0, vocab, args.input_len).tolist()
        core.add(core.make_request(prompt, params, f"r{i}"))
    profile = cProfile.Profile() if args.profile else None
    gc_before = [g["collections"] for g in gc.get_stats()]
    steps: dict[str, list[dict[str, float]]] = {"full": [], "all": []}
    full = args.max_num_seqs - FULL_MARGIN
    start = time.perf_counter()
    num_steps = 0
    shapes: list[tuple[int, int]] = []
    try:
        while core.has_work:
            clock.reset()
            step_start = timer()
            is_profiled = profile is not None and clock_full(core, full)
            if is_profiled:
                assert profile is not None
                profile.enable()
            core.step()
            if is_profiled:
                assert profile is not None
                profile.disable()
            wall = timer() - step_start
            num_steps += 1
            record = dict(clock.seconds, step=wall)
            shapes.append((clock.num_rows, clock.num_decode_rows))
            if clock.num_rows >= full:
                steps["full"].append(record)
            if clock.num_rows:
                steps["all"].append(record)
    finally:
        core.close()
        gc.callbacks.remove(gc_phase)
    elapsed = time.perf_counter() - start
    summary: dict[str, Any] = {"elapsed_s": elapsed, "num_steps": num_steps, "shapes": shapes}
    summary["gc_collections"] = [g["collections"] - b for g, b in zip(gc.get_stats(), gc_before)]
    for kind, records in steps.items():
        names = sorted({k for r in records for k in r})
        summary[kind] = {
            "num_steps": len(records),
            "mean_us": {n: 1e6 * statistics.fmean(r.get(n, 0.0) for r in records) for n in names} if records else {},
            "median_us": {n: 1e6 * statistics.median(r.get(n, 0.0) for r in records) for n in names} if records else {},
        }
    if profile is not None:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.profile)
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--kv-pool-gb", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--async-scheduling", choices=("on", "off"), default="on")
    p.add_argument("--no-steady", action="store_true", help="EngineConfig.steady_decode off")
    p.add_argument("--decode-graphs", action="store_true", help="decode steps through DecodeGraphs' buckets")
    p.add_argument("--no-graphs", action="store_true", help="ONNX Runtime's run a no-op: the host work alone")
    p.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions over decode steps")
    p.add_argument("--profile-steps", type=int, default=50, help="decode steps profiled (after 10)")
    p.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="the engine thread's CPU time (others' load aside), or wall time"
    )
    p.add_argument("--label", default="")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    summary = run(args)
    summary["label"] = args.label
    for kind in ("full", "all"):
        s = summary[kind]
        if not s["num_steps"]:
            continue
        parts = ", ".join(f"{n} {v:.0f}" for n, v in s["mean_us"].items() if n != "step")
        print(f"{args.label} {kind} steps {s['num_steps']}: step {s['mean_us']['step']:.0f} us mean ({parts})")
        parts = ", ".join(f"{n} {v:.0f}" for n, v in s["median_us"].items() if n != "step")
        print(f"{args.label} {kind} median: step {s['median_us']['step']:.0f} us ({parts})")
    print(
        f"{args.label} run: {summary['num_steps']} steps in {summary['elapsed_s']:.2f} s; "
        f"the cyclic GC's passes by generation {summary['gc_collections']}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
