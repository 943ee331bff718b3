"""The webgpu op flavour against the portable one on one device: greedy ids and decode step time, at a named
Gemma 3's real shape with random fp16 weights (the same weights in every export: one seed).

    export   --layers layers of --shape in each of --flavours (wicore.export.random_weights), into
             --work/{shape}-{layers}l-fp16-{flavour} (kept, reused; --jobs exports at once). A flavour is
             an op flavour, "-q4" for its 4-bit weights (webgpu-q4: webgpu-quant, MatMulNBits), "+paged" for
             the paged attention (webgpu+paged: the WebGPU EP's PagedAttention)
    ids      greedy ids of 3 random prompts (7, 60 and 300 tokens) on --devices, each export, and the
             margin of each prompt's first token: its logit over the runner-up's (a near-tie when small)
    time     decode steps at --batch from --context (step_timing.decode_steps: the engine's core,
             median of --steps after 3 warm-up steps)

The first flavour's ids are the reference; with --compare-with, the first flavour's ids of an earlier
run's record (another device, another ONNX Runtime install: onnxruntime-gpu for CUDA, onnxruntime
>= 1.32 with the WebGPU plugin for WebGPU). The H100 run (docs/PERFORMANCE.md, "The webgpu op flavour"):

    python tools/check_webgpu_flavour.py --devices cuda:0 --json cuda.json           # the CUDA install
    python tools/check_webgpu_flavour.py --devices webgpu --compare-with cuda.json --json webgpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from benchlib import write_record
from step_timing import Config, decode_steps, engine_config

from wicore.engine.config import EngineConfig
from wicore.engine.engine import Engine
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.random_weights import RandomFloatSource
from wicore.model.config import DecoderConfig
from wicore.model.shapes import hf_config
from wicore.types.sampling import SamplingParams

PROMPT_LENGTHS = (7, 60, 300)


def export_config(flavour: str) -> ExportConfig:
    """Flavour names: "webgpu", "webgpu-q4+paged", ...: the op flavour ("-q4": its quantized form in 4 bits), "+paged": the paged attention."""
    name, _, attention = flavour.partition("+")
    op_flavour, bits = (name[: -len("-q4")], 4) if name.endswith("-q4") else (name, 8)
    if bits == 4:
        op_flavour = {"webgpu": "webgpu-quant", "portable": "ort-quant"}[op_flavour]
    return ExportConfig(dtype="fp16", op_flavour=op_flavour, weight_bits=bits, attention=attention or "portable", overwrite=True)


def export(work: Path, shape: str, layers: int, flavour: str) -> Path:
    out = work / f"{shape}-{layers}l-fp16-{flavour}"
    if not (out / "wicore.json").is_file():
        hf = hf_config(shape, layers)
        hf["layer_types"] = [*list(hf["layer_types"])[:-1], "full_attention"]  # type: ignore[call-overload]  # as bench_structured_gpu.py
        source = RandomFloatSource(DecoderConfig.from_hf({"model_type": "gemma3_text", **hf}))
        start = time.perf_counter()
        export_model(source, out, export_config(flavour), progress=lambda _: None)
        print(f"exported {out.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def greedy_ids(model_dir: Path, devices: str, new_tokens: int, threads: int) -> tuple[list[list[int]], list[float]]:
    """Each prompt's greedy ids, and its first token's logit margin over the runner-up."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1000, 200_000, n).tolist() for n in PROMPT_LENGTHS]
    config = EngineConfig(model_dir=model_dir, devices=devices, num_threads=threads, num_host_blocks=0, num_nvme_blocks=0)
    with Engine(config) as engine:
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, prompt_logits=True)
        done = engine.generate(prompts, params)
    errors = [c.error for c in done if c.error]
    if errors or any(c.prompt_logits is None for c in done):
        raise RuntimeError(f"{model_dir.name} on {devices}: {errors[0] if errors else 'no prompt logits'}")
    tops = [np.sort(c.prompt_logits[-1])[-2:] for c in done if c.prompt_logits is not None]
    return [c.token_ids for c in done], [float(top[1] - top[0]) for top in tops]


def step_ms(model_dir: Path, batch: int, timing: Config) -> float:
    with Engine(engine_config(model_dir, batch, timing)) as engine:
        return 1000 * statistics.median(decode_steps(engine, batch, timing).step_seconds)


def equal_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", required=True, help="one placement: webgpu, cuda:0, cpu, ...")
    ap.add_argument("--shape", default="gemma3-1b")
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--flavours", default="portable,webgpu", help="the first is the reference")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wicore-webgpu-flavour"))
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=1, help="exports made at once (processes)")
    ap.add_argument("--export-only", action="store_true", help="make the exports, run nothing")
    ap.add_argument("--compare-with", type=Path, default=None, help="an earlier run's --json: its first flavour's ids")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    flavours = [f.strip() for f in a.flavours.split(",") if f.strip()]
    batches = tuple(int(b) for b in a.batch.split(","))
    timing = Config((), batches, a.context, a.threads, a.steps, a.devices, False, None)
    ids: dict[str, list[list[int]]] = {}
    margins: dict[str, list[float]] = {}
    ms: dict[str, dict[int, float]] = {}
    with ProcessPoolExecutor(a.jobs) as pool:
        folders = dict(zip(flavours, pool.map(export, *zip(*[(a.work, a.shape, a.layers, f) for f in flavours]))))
    if a.export_only:
        return 0
    for flavour in flavours:
        ids[flavour], margins[flavour] = greedy_ids(folders[flavour], a.devices, a.new_tokens, a.threads)
        print(f"{flavour} on {a.devices}: first-token margins {[round(m, 4) for m in margins[flavour]]}", flush=True)
        ms[flavour] = {b: step_ms(folders[flavour], b, timing) for b in batches}
        print(
            f"{flavour} on {a.devices}: " + ", ".join(f"batch {b} {t:.2f} ms a step" for b, t in ms[flavour].items()), flush=True
        )
    reference, label = ids[flavours[0]], f"{flavours[0]} on {a.devices}"
    if a.compare_with is not None:
        earlier = json.loads(a.compare_with.read_text())
        reference, label = earlier["ids"][earlier["flavours"][0]], f"{earlier['flavours'][0]} on {earlier['devices']}"
    agree = {f: [equal_prefix(r, x) for r, x in zip(reference, ids[f])] for f in flavours}
    for flavour, counts in agree.items():
        print(f"{flavour} on {a.devices} against {label}: ids equal before the first difference {counts} of {a.new_tokens}")
    for b in batches:
        print(f"batch {b}: " + ", ".join(f"{f} {ms[flavours[0]][b] / ms[f][b]:.2f}x {flavours[0]}'s speed" for f in flavours[1:]))
    if a.json is not None:
        steps = {f: {str(b): t for b, t in m.items()} for f, m in ms.items()}
        write_record(a.json, timing, devices=a.devices, flavours=flavours, ids=ids, agree=agree, step_ms=steps, margins=margins)
    return 0 if all(n == a.new_tokens for counts in agree.values() for n in counts) else 1


if __name__ == "__main__":
    sys.exit(main())
