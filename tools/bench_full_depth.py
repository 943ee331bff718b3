"""A named Gemma 3 at its full depth in 4 or 8 bits (or fp16) on one GPU, with a long prompt, inside a
device budget: does it fit a smaller card, and what does it cost against the whole card?

tools/bench_long_shapes.py solves full-depth figures from three-layer models; this one runs the
whole model. Its weights are random blocks made a layer at a time (wicore/export/random_weights.py: no
checkpoint, which would not fit the device's disk beside the export), exported with one partition
per full-attention layer (each partition's full layer then shares one stage when KV is offloaded).

Each run is one request of `--context` random prompt tokens, prefilled in `--prefill-chunk`
chunks, then `--decode-steps` greedy steps (long_runs.wicore_long: the engine's own step
loop, a warm-up request first), in a process of its own:

    all-device      every block on the device, the whole card (the peer: speed, and tokens, which
                    say little: a random tied-embedding model repeats its prompt's last token)
    offload F @ B    a share F of the full layers' blocks on the device, the rest offloaded to
                    the host tier at every step, with only B GiB of the card free to the process

The budget is real: a helper process (torch) takes all the card's free memory but B GiB before
the run starts and holds it until the run ends, so the run's CUDA context, weights, KV, stage and
ONNX Runtime's arenas must all fit in B or fail with an out-of-memory error (recorded). A 24 GB
card (RTX 3090 / 4090: 24,564 MiB) has about 23.5 GiB free to a process without a display;
an L4 (23,034 MiB) about 22. "Used" is B minus the least free memory seen after any step.

    PYTHONPATH=/tmp/site:. python3 tools/bench_full_depth.py --shape gemma3-27b --context 130944 \\
        --offload-fraction 0.1 --budgets 23.5 --work /tmp/full --json full.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import cuda_memory, write_record
from long_runs import GIB, DeviceMemory, wicore_long
from long_runs import Config as LongConfig

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.random_weights import RandomFloatSource, RandomQuantSource
from wicore.graph.manifest import Manifest
from wicore.model.shapes import SHAPES

BALLAST = """
import sys, torch
budget = float(sys.argv[1])
free, total = torch.cuda.mem_get_info()
held = torch.empty(max(0, free - int(budget * 2**30)), dtype=torch.uint8, device="cuda") if budget > 0 else None
print(torch.cuda.mem_get_info()[0], total, flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class Config:
    shape: str
    context: int
    bits: int
    offload_fraction: float
    budgets: tuple[float, ...]
    all_device: bool
    prefill_chunk: int
    decode_steps: int
    work: Path
    json_path: Path | None


class CardMemory(DeviceMemory):
    """What this process takes of the card: the memory free before it started (`free_before`, the
    helper's report) less the free memory seen now, through the CUDA runtime ONNX Runtime uses."""

    def __init__(self, free_before: int) -> None:
        self.base, self.peak, self.free_before = 0, 0, free_before

    def _used(self) -> int:
        return self.free_before - cuda_memory()[0]


def export(config: Config) -> Path:
    floats = config.bits == 16
    source = RandomFloatSource.of_shape(config.shape) if floats else RandomQuantSource.of_shape(config.shape, config.bits)
    num_full = sum(1 for t in source.config.layer_types if t == "full_attention")
    label = "fp16" if floats else f"int{config.bits}e"
    out = config.work / f"{config.shape}-full-{label}-p{num_full}"
    if not (out / "wicore.json").is_file():
        start = time.perf_counter()
        # the random source's embedding is its blocks: the rows are gathered from the head's codes
        quant = {} if floats else dict(op_flavour="ort-quant", weight_bits=config.bits, accuracy_level=0, quantize_embedding=True)
        settings = ExportConfig(dtype="fp16", attention="paged", num_partitions=num_full, overwrite=True, **quant)  # type: ignore[arg-type]
        export_model(source, out, settings, progress=lambda _: None)
        print(f"exported {out.name} ({num_full} partitions) in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def measured(model_dir: Path, context: int, config: LongConfig, fraction: float | None, free_before: int) -> dict[str, Any]:
    return wicore_long(model_dir, context, config, fraction, CardMemory(free_before))


def run_within(model_dir: Path, config: Config, fraction: float | None, budget: float | None) -> dict[str, Any]:
    """One request in a process of its own, with `budget` GiB of the card free to it (None: all)."""
    long = LongConfig(
        shape=config.shape, contexts=(config.context,), variants=(), prefill_chunk=config.prefill_chunk,
        decode_steps=config.decode_steps, devices="cuda:0", work=config.work, hf=False, json_path=None,
    )  # fmt: skip
    helper = subprocess.Popen(
        [sys.executable, "-c", BALLAST, str(budget or 0)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert helper.stdout is not None
        report = helper.stdout.readline().split()
        if len(report) != 2:
            raise SystemExit(f"error: the helper that holds the card's memory failed (torch with CUDA?): {report}")
        free_before, total = map(int, report)
        record: dict[str, Any] = {"fraction_on_device": fraction, "budget_gib": budget, "free_before_gib": free_before / GIB}
        if budget is not None and free_before > budget * GIB + (64 << 20):
            raise SystemExit(f"error: {free_before / GIB:.2f} GiB free, not the {budget} GiB asked: the budget would not hold")
        try:  # a worker that dies (segfault, the OOM killer) raises BrokenProcessPool here, not a hang
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                record |= pool.submit(measured, model_dir, config.context, long, fraction, free_before).result()
            record["fits"] = True
        except Exception as exc:  # out of memory: the budget is too small; anything else: no answer
            message = str(exc)
            oom = any(m in message.lower() for m in ("out of memory", "failed to allocate", "alloc_failed"))
            # ONNX Runtime's CUDA errors open with a long C++ signature: keep the end, where the status is
            short = message if len(message) <= 900 else f"{message[:300]} ... {message[-600:]}"
            record |= {"fits": False if oom else None, "error": short}
        record["card_gib"] = total / GIB
        return record
    finally:
        helper.kill()
        helper.wait()


def run(config: Config) -> int:
    config.work.mkdir(parents=True, exist_ok=True)
    model_dir = export(config)
    manifest = Manifest.read(model_dir)
    print(f"{config.shape}: {manifest.config.num_layers} layers, {len(manifest.partitions)} partitions", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    if config.all_device:
        runs["all-device"] = run_within(model_dir, config, None, None)
    for budget in config.budgets:
        runs[f"offload {config.offload_fraction:g} @ {budget:g} GiB"] = run_within(
            model_dir, config, config.offload_fraction, budget
        )
    peer = runs.get("all-device", {}).get("tokens")
    print(f"\n{config.shape}, {config.context} tokens, {'fp16' if config.bits == 16 else f'int{config.bits}'} weights, batch 1")
    print("| run | fits | prefill s | prefill tok/s | decode ms | used GiB (weights + KV + stage + rest) | same tokens |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, r in runs.items():
        if not r["fits"]:
            print(f"| {name} | {'no' if r['fits'] is False else 'error'}: {r['error'][:120]} | | | | | |")
            continue
        r["same_tokens_as_all_on_device"] = None if peer is None else r["tokens"] == peer
        rest = r["peak_gib"] - r["weights_gib"] - r["kv_gib"] - r["stage_gib"]
        print(
            f"| {name} | yes | {r['prefill_s']:.1f} | {config.context / r['prefill_s']:.0f} | {r['decode_ms']:.1f} | "
            f"{r['peak_gib']:.1f} ({r['weights_gib']:.1f} + {r['kv_gib']:.1f} + {r['stage_gib']:.1f} + {rest:.1f}) | "
            f"{r['same_tokens_as_all_on_device']} |"
        )
    print(json.dumps({n: {k: v for k, v in r.items() if k != "tokens"} for n, r in runs.items()}), flush=True)
    if config.json_path is not None:
        write_record(config.json_path, config, results=runs)
    return 0 if all(r["fits"] for r in runs.values()) else 1  # a budget too small is an answer, but not a pass


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b", choices=sorted(SHAPES))
    p.add_argument("--context", type=int, default=130944, help="prompt tokens")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8, 16), help="weight bits: 4 / 8 (MatMulNBits) or 16 (fp16)")
    p.add_argument(
        "--offload-fraction", type=float, default=0.1, help="share of the full layers' KV on the device in budgeted runs"
    )
    p.add_argument("--budgets", default="23.5", help="GiB of the card free to each offloaded run (comma-separated)")
    p.add_argument("--no-all-device", dest="all_device", action="store_false", help="skip the all-device peer run")
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-full"), help="the export (kept, reused)")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    budgets = tuple(float(b) for b in a.budgets.split(",") if b)
    if not 0 < a.offload_fraction < 1 or any(b <= 0 for b in budgets) or a.context < 1:
        raise SystemExit("error: --offload-fraction between 0 and 1, --budgets and --context positive")
    return Config(
        a.shape, a.context, a.bits, a.offload_fraction, budgets, a.all_device, a.prefill_chunk,
        a.decode_steps, a.work, a.json,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
