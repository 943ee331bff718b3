"""Check that KV blocks paged out of the device pool and back come back exact: greedy outputs of a
tiny device pool with host and NVMe tiers must equal those of an unconstrained run.

    reference    device pool large enough for everything, no host / NVMe tier
    paged        --device-blocks (tiny), --host-blocks, --nvme-blocks: requests are preempted by
                 swapping (device <-> host/NVMe) and cached prefixes are demoted and promoted
    paged-ort    (--force-ort-store) the paged run again with tier 0 forced to OrtPoolStore, the
                 gather/scatter graphs, even where the pools are NumPy (CPU EP): its outputs must
                 equal the paged run's token for token (same schedule: phase A is queued before the
                 first step, phase B runs one request at a time)

The workload, the same for every run:

    phase A   --requests requests at once, one shared system prompt + a distinct question each:
              more than the device pool holds, so running requests are swapped out and in
    phase B   one follow-up per request, one at a time: its prompt is the phase-A prompt + answer
              + a new question, so its prefix is found in whatever tier it was demoted to

Before the paged run's workload, the tier-0 store's own round trip is checked on the engine's
real pools (write random blocks to the first and last usable frames, read them back bit-exact,
restore). Prints one JSON object: moves per tier pair, preemptions, prefix hits, whether outputs
are equal (and where the first difference is), seconds spent in the pager.

Greedy decoding of a differently batched run can flip a near-tie in fp16 on a GPU without any
paging bug: a difference is reported per request with its first differing position; the
paged vs paged-ort comparison has no such excuse.

Each block group of the engine (full-attention layers, sliding layers) has its own tier-0 store
and pager; moves are reported summed and per group. Exit status 0 when outputs are equal, moves
went both out of and into the device tier, and the store round trips were exact.

Usage (from the repository root; WiCore importable, e.g. PYTHONPATH=.):
    wicore-export --model gemma3-270m --out /tmp/g3 --partitions 3
    PYTHONPATH=. python tools/check_device_paging.py /tmp/g3 --devices cpu --force-ort-store
    PYTHONPATH=. python tools/check_device_paging.py /tmp/g3-fp16 --devices cuda --json paging.json
    PYTHONPATH=. python tools/check_device_paging.py /tmp/g3-paged --devices cuda:0 --cuda-graphs   # paged runs captured
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from wicore.blocks.tier import Tier
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.kv.device_store import ort_pool_store
from wicore.kv.tiers import BatchedTierStore
from wicore.types.sampling import SamplingParams

SYSTEM = (
    "You are a careful assistant. Answer in one short paragraph, plainly, without lists. "
    "Prefer concrete facts over opinions, and say so when you are not sure of something. "
)
QUESTIONS = [
    "Why is the sky blue during the day?",
    "How does a refrigerator keep food cold?",
    "What is the difference between weather and climate?",
    "Why do leaves change colour in autumn?",
    "How do bees make honey?",
    "What causes the tides in the ocean?",
    "How does a compass find north?",
    "Why does bread rise when it is baked?",
]
FOLLOW_UP = " Thank you. Now explain the same thing to a ten year old, in two sentences."


def prompt_ids(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def group_stores(engine: Engine) -> list[tuple[str, list[int], object]]:
    """(group name, its layers, its pager) per block group: full-attention, then sliding layers."""
    layout = engine.layout
    groups = [(name, list(layers)) for name, layers in (("full", layout.full_layers), ("window", layout.window_layers)) if layers]
    return [(name, layers, pager) for (name, layers), pager in zip(groups, engine.core.kv.pagers)]


def check_store_round_trip(store) -> bool:
    """Random blocks written to the first usable and the last frame of tier 0 read back bit-exact,
    one by one and batched; the frames' contents are restored after."""
    frames = [1, store.num_frames - 1]  # block 0 is the padding sink
    saved = [store.read(s) for s in frames]
    rng = np.random.default_rng(0)
    ok = True
    for frame, old in zip(frames, saved):
        data = rng.standard_normal(old.shape).astype(old.dtype)
        store.write(frame, data)
        ok &= store.read(frame).tobytes() == data.tobytes()
    if isinstance(store, BatchedTierStore):
        data = rng.standard_normal((len(frames), *saved[0].shape)).astype(saved[0].dtype)
        store.write_many(frames, data)
        ok &= store.read_many(frames).tobytes() == data.tobytes()
    for frame, old in zip(frames, saved):
        store.write(frame, old)
        ok &= store.read(frame).tobytes() == old.tobytes()
    return bool(ok)


def time_store(store, counts: tuple[int, ...] = (1, 8)) -> dict[str, float]:
    """Median ms of read_many / write_many of n blocks (written back unchanged), BatchedTierStore only."""
    result = {}
    for n in counts:
        frames = list(range(1, min(n, store.num_frames - 1) + 1))
        data = store.read_many(frames)
        for op, call in (
            ("read", lambda s=frames: store.read_many(s)),
            ("write", lambda s=frames, d=data: store.write_many(s, d)),
        ):
            times = []
            for _ in range(11):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            result[f"{op}_many_{len(frames)}_ms"] = round(1e3 * sorted(times)[len(times) // 2], 3)
    return result


def run_workload(config: EngineConfig, args: argparse.Namespace, force_ort_store: bool) -> dict[str, object]:
    engine = Engine(config)
    try:
        groups = group_stores(engine)
        if force_ort_store:  # the same KV buffers, paged by the gather / scatter graphs
            buffers = engine.core.runner.graphs.buffers
            for _, layers, pager in groups:
                pager.stores[Tier.DEVICE] = ort_pool_store(
                    [buffers.values(i) for i in layers], [buffers.layer_devices[i] for i in layers], buffers.dtype, args.threads
                )
        stores = {name: type(pager.stores[Tier.DEVICE]).__name__ for name, _, pager in groups}
        self_check = (
            {name: check_store_round_trip(pager.stores[Tier.DEVICE]) for name, _, pager in groups}
            if config.num_host_blocks
            else None
        )
        timings = (
            {
                name: time_store(pager.stores[Tier.DEVICE])
                for name, _, pager in groups
                if isinstance(pager.stores[Tier.DEVICE], BatchedTierStore)
            }
            if config.num_host_blocks
            else {}
        )
        params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        questions = (QUESTIONS * (args.requests // len(QUESTIONS) + 1))[: args.requests]
        prompts = [prompt_ids(engine, SYSTEM + q) for q in questions]
        start = time.perf_counter()
        ids = [engine.add_request(p, params) for p in prompts]  # all queued before the first step
        engine.start()
        answers = [[t for out in engine.outputs(i) for t in out.new_token_ids] for i in ids]
        follow_ups = []
        for prompt, answer in zip(prompts, answers):
            ids = prompt + answer + prompt_ids(engine, FOLLOW_UP)[1:]  # no second BOS
            follow_ups.append(engine.generate([ids], params)[0].token_ids)
        seconds = time.perf_counter() - start
        stats = engine.stats()
        moves: dict[str, int] = {}
        by_group = {}
        for name, _, pager in groups:
            mine = {f"{src}->{dst}": n for (src, dst), n in sorted(pager.stats.num_moves.items())}
            by_group[name] = mine
            for key, n in mine.items():
                moves[key] = moves.get(key, 0) + n
        return {
            "devices": config.devices,
            "stores": stores,
            "device_blocks_per_group": {name: pager.stores[Tier.DEVICE].num_frames for name, _, pager in groups},
            "host_blocks": config.num_host_blocks,
            "nvme_blocks": config.num_nvme_blocks,
            "store_self_check": self_check,
            "store_timings": timings,
            "moves": dict(sorted(moves.items())),
            "moves_by_group": by_group,
            "preempted_swap": stats.preempted_swap,
            "preempted_recompute": stats.preempted_recompute,
            "prefix_hit_rate": round(stats.prefix_hit_rate, 4),
            "corrupt_blocks": stats.corrupt_blocks,
            "pager_seconds": round(engine.core.seconds.moves_s, 4),
            "seconds": round(seconds, 2),
            "outputs": answers + follow_ups,
        }
    finally:
        engine.stop()


def compare(a: list[list[int]], b: list[list[int]]) -> dict[str, object]:
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            first = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            diffs.append({"request": i, "first_difference": first, "tokens": len(x)})
    return {"outputs_equal": not diffs and len(a) == len(b), "differences": diffs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--devices", default="cpu", help="as wicore's --devices: cpu, cuda, cuda:0,cuda:1, ...")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None, help="tokens a KV block (default: the engine's for the model)")
    parser.add_argument("--cuda-graphs", action="store_true", help="the paged runs replay decode steps from CUDA graphs")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--device-blocks", type=int, default=10, help="tier 0 of the paged run, sink included")
    parser.add_argument("--host-blocks", type=int, default=6)
    parser.add_argument("--nvme-blocks", type=int, default=64)
    parser.add_argument("--force-ort-store", action="store_true", help="also run the paged workload on OrtPoolStore")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--timeout", type=float, default=1800, help="dump every thread's stack and exit after this many seconds")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # a failed engine step can leave generate() waiting

    with tempfile.TemporaryDirectory(prefix="wicore-check-") as nvme_dir:
        base = {
            "model_dir": args.model_dir,
            "num_threads": args.threads,
            "block_size": args.block_size,
            "devices": args.devices,
            "scheduler": SchedulerConfig(max_num_seqs=args.requests),
        }
        reference_cfg = EngineConfig(**base, num_device_blocks=512, num_host_blocks=0, num_nvme_blocks=0)
        paged_cfg = EngineConfig(
            **base,
            num_device_blocks=args.device_blocks,
            num_host_blocks=args.host_blocks,
            num_nvme_blocks=args.nvme_blocks,
            nvme_dir=Path(nvme_dir),
            cuda_graphs=args.cuda_graphs,
        )
        runs = {"reference": run_workload(reference_cfg, args, False), "paged": run_workload(paged_cfg, args, False)}
        if args.force_ort_store:
            runs["paged_ort"] = run_workload(paged_cfg, args, True)
    outputs = {name: run.pop("outputs") for name, run in runs.items()}
    result: dict[str, object] = {"model_dir": str(args.model_dir), "devices": args.devices, "cuda_graphs": args.cuda_graphs}
    for name, run in runs.items():
        if name != "reference":
            run["vs_reference"] = compare(outputs["reference"], outputs[name])
        if name == "paged_ort":
            run["vs_paged"] = compare(outputs["paged"], outputs[name])
    result["runs"] = runs
    paged_runs = [r for n, r in runs.items() if n != "reference"]
    result["paged_moves_happened"] = all(
        any(k.startswith("device->") and not k.endswith("dropped") for k in r["moves"])
        and any(k.endswith("->device") for k in r["moves"])
        for r in paged_runs
    )
    result["self_checks_exact"] = all(all(r["store_self_check"].values()) for r in paged_runs)
    result["outputs_equal"] = all(r["vs_reference"]["outputs_equal"] for r in paged_runs) and all(
        r.get("vs_paged", {"outputs_equal": True})["outputs_equal"] for r in paged_runs
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result["outputs_equal"] and result["paged_moves_happened"] and result["self_checks_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
