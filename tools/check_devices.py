"""Greedy token ids of one export on several devices, each engine in turn: whether another EP
(WebGPU, OpenVINO, a second GPU) decodes what the reference device does.

Prompts are random token ids (so a random-weight export needs no tokenizer text); every request
generates exactly --new-tokens greedy tokens. The first device is the reference; for each other
one, the tokens equal before the first difference, per prompt.

Usage (the H100 run of docs/PERFORMANCE.md, "WebGPU against CUDA"):
    PYTHONPATH=.:tools python tools/check_devices.py --model-dir M --devices 'cuda:0;webgpu' --json ids.json
(`;` separates devices; one device may be a placement such as `cuda:0,cpu`.)

Where the devices need different ONNX Runtime installs (onnxruntime-gpu for CUDA, onnxruntime >= 1.32
with the WebGPU plugin), run each in its own environment and compare with the first run's record;
the exports may differ in op flavour when they hold the same weights (random weights of one seed):
    python tools/check_devices.py --model-dir M-portable --devices cuda:0 --json cuda.json
    python tools/check_devices.py --model-dir M-webgpu --devices webgpu --compare-with cuda.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from wicore.engine.config import EngineConfig
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams


def greedy_ids(model_dir: Path, devices: str, prompts: list[list[int]], new_tokens: int, threads: int) -> list[list[int]]:
    config = EngineConfig(
        model_dir=model_dir,
        devices=devices,
        num_threads=threads,
        num_host_blocks=0,
        num_nvme_blocks=0,
        verify_files=False,
        cuda_graphs=False,
    )
    with Engine(config) as engine:
        done = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    errors = [c.error for c in done if c.error]
    if errors:
        raise RuntimeError(f"{devices}: {errors[0]}")
    return [c.token_ids for c in done]


def equal_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--devices", required=True, help="';'-separated device placements, the first the reference")
    ap.add_argument("--prompt-lengths", default="7,60,300", help="random prompts of these lengths (token ids)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--compare-with", type=Path, default=None, help="a record of another run (--json): its first device is the reference"
    )
    a = ap.parse_args(argv)
    placements = [d.strip() for d in a.devices.split(";") if d.strip()]
    if len(placements) < (1 if a.compare_with else 2):
        ap.error("--devices needs two placements or more, e.g. 'cpu;webgpu', or one with --compare-with")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1000, 200_000, int(n)).tolist() for n in a.prompt_lengths.split(",")]
    ids = {}
    if a.compare_with is not None:
        earlier = json.loads(a.compare_with.read_text())
        if earlier["prompt_lengths"] != a.prompt_lengths:
            ap.error(f"--compare-with {a.compare_with} ran prompts of lengths {earlier['prompt_lengths']}: pass those")
        first = next(iter(earlier["ids"]))
        reference_label = f"{first} ({a.compare_with.name})"
        ids[reference_label] = [row[: a.new_tokens] for row in earlier["ids"][first]]
        placements = [reference_label, *placements]
    for devices in placements[1 if a.compare_with else 0 :]:
        start = time.perf_counter()
        ids[devices] = greedy_ids(a.model_dir, devices, prompts, a.new_tokens, a.threads)
        print(f"{devices}: {time.perf_counter() - start:.1f} s", flush=True)
    reference = ids[placements[0]]
    agree = {d: [equal_prefix(r, x) for r, x in zip(reference, ids[d])] for d in placements[1:]}
    for d, counts in agree.items():
        print(f"{d} against {placements[0]}: tokens equal before the first difference {counts} of {a.new_tokens}")
    if a.json is not None:
        a.json.write_text(json.dumps({"prompt_lengths": a.prompt_lengths, "ids": ids, "agree": agree}, indent=1))
    return 0 if all(n == a.new_tokens for counts in agree.values() for n in counts) else 1


if __name__ == "__main__":
    sys.exit(main())
