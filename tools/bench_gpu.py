"""GPU check and benchmark: CUDA EP correctness against the CPU EP, decode speed against HF.

Runs on a machine with onnxruntime-gpu and torch (see docs/HARDWARE.md for how it was run on
an H100). For the real Gemma 3 270M GGUF it:
  1. exports fp32 (1 and 3 partitions), fp16 (1 and 3) and, with `--quant`, ort-quant graphs;
  2. compares greedy tokens and prompt logits of CUDA fp16, CUDA fp32, a CUDA + CPU placement,
     with two GPUs a cuda:0 + cuda:1 placement, and ort-quant on CUDA and CPU, against CPU
     fp32, on three prompts (one past the sliding window);
  3. times batch decode (1, 8, 32 rows) of WiCore on CUDA fp16 (and ort-quant) and of HF
     transformers (eager, bf16, on the same GPU), in the same run.

    python tools/bench_gpu.py --gguf model.gguf --work /tmp/wicore-gpu --json result.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.gguf import GGUFSource
from wicore.cli.verify import VERIFY_TEXT
from wicore.runtime.generator import Generator
from wicore.runtime.sampler import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", " ".join([VERIFY_TEXT] * 9)]


def export(gguf: Path, out: Path, dtype: str, partitions: int, flavour: str = "portable") -> Path:
    if not (out / "wicore.json").exists():
        config = ExportConfig(dtype=dtype, num_partitions=partitions, op_flavour=flavour)
        export_model(GGUFSource(gguf), out, config, progress=lambda _: None)
    return out


def num_gpus() -> int:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def compare(gguf: Path, work: Path, new_tokens: int, quant: bool) -> dict:
    fp32 = export(gguf, work / "fp32", "fp32", 1)
    fp32_3 = export(gguf, work / "fp32-p3", "fp32", 3)
    fp16 = export(gguf, work / "fp16", "fp16", 1)
    runs = [
        ("cuda fp16", fp16, "cuda:0"),
        ("cuda fp32", fp32, "cuda:0"),
        ("cuda:0 + cpu fp32 (3 partitions)", fp32_3, "cuda:0,cuda:0,cpu"),
    ]
    if num_gpus() >= 2:
        runs.append(("cuda:0 + cuda:1 fp16 (3 partitions)", export(gguf, work / "fp16-p3", "fp16", 3), "cuda:0,cuda:1,cuda:1"))
    if quant:
        try:
            quantized = export(gguf, work / "ort-quant", "fp32", 1, "ort-quant")
            runs += [("cuda ort-quant", quantized, "cuda:0"), ("cpu ort-quant", quantized, "cpu")]
        except Exception as exc:  # report and go on with the other checks
            print("ort-quant export failed:", repr(exc), flush=True)
    ref = Generator.load(fp32, devices="cpu", num_threads=8)
    prompts = [ref.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    ref_tokens = ref.generate(prompts, params).token_ids
    ref_logits = [ref.prompt_logits(p) for p in prompts]
    report = {}
    for name, folder, devices in runs:
        try:
            gen = Generator.load(folder, devices=devices, num_threads=8)
        except Exception as exc:  # e.g. a flavour this EP refuses: report it and go on
            report[name] = {"error": repr(exc)}
            print(name, json.dumps(report[name]), flush=True)
            continue
        tokens = gen.generate(prompts, params).token_ids
        logits = [gen.prompt_logits(p) for p in prompts]
        first_diff = [next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), None) for t, r in zip(tokens, ref_tokens)]
        report[name] = {
            "devices": [d.label for d in gen.devices],
            "identical_tokens": [t == r for t, r in zip(tokens, ref_tokens)],
            "first_divergence": first_diff,
            "max_abs_logit_diff": [float(np.abs(a - b).max()) for a, b in zip(logits, ref_logits)],
            "argmax_agreement": [float((a.argmax(-1) == b.argmax(-1)).mean()) for a, b in zip(logits, ref_logits)],
        }
        print(name, json.dumps(report[name]), flush=True)
    report["prompt_lengths"] = [len(p) for p in prompts]
    return report


def engine_matches_generator(gguf: Path, work: Path, new_tokens: int, devices: str) -> dict:
    """The serving engine (sliding layers releasing their blocks behind the window, KV pools on
    `devices`) against the offline generator (every block kept) on the same GPU: the same greedy
    tokens for the three prompts, run concurrently, the third 3x the window."""
    from wicore.runtime.engine import Engine, EngineConfig

    folder = export(gguf, work / "fp16-p3", "fp16", 3)
    gen = Generator.load(folder, devices=devices, num_threads=8)
    prompts = [gen.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    expected = [gen.generate([p], params).token_ids[0] for p in prompts]
    config = EngineConfig(model_dir=folder, devices=devices, num_threads=8, host_tier_gb=0.5)
    with Engine(config).start() as engine:
        got = engine.generate(prompts, params)
        groups = engine.stats()["kv_groups"]
    report = {
        "devices": devices,
        "identical_tokens": [a == b for a, b in zip(got, expected)],
        "first_divergence": [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(got, expected)],
        "window_blocks_free": groups["window"]["blocks_free"]["device"],
    }
    print("engine vs generator", json.dumps(report), flush=True)
    return report


def bench_wicore(folder: Path, batch: int, new_tokens: int) -> float:
    gen = Generator.load(folder, devices="cuda:0", num_threads=8)
    prompts = [gen.tokenizer.encode(f"Story {i}: once upon a time") for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    gen.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    out = gen.generate(prompts, params)
    return batch * out.num_decode_steps / out.decode_seconds


def bench_hf(gguf: Path, batch: int, new_tokens: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    ids = torch.full((batch, 8), 2, dtype=torch.long, device="cuda")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        first = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        prefill = time.perf_counter() - first
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
        total = time.perf_counter() - start
    return batch * (new_tokens - 1) / (total - prefill)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/wicore-gpu"))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--quant", action="store_true", help="also export and check the ort-quant flavour")
    ap.add_argument("--engine-only", action="store_true", help="only the engine-vs-generator check")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpus": num_gpus()}
    devices = "cuda:0,cuda:1,cuda:1" if result["gpus"] >= 2 else "cuda:0"
    result["engine"] = engine_matches_generator(args.gguf, args.work, args.new_tokens, devices)
    if args.engine_only:
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    result["compare"] = compare(args.gguf, args.work, args.new_tokens, args.quant)
    speed = {}
    for batch in (int(b) for b in args.batches.split(",")):
        speed[batch] = {"wicore cuda fp16": bench_wicore(args.work / "fp16", batch, args.new_tokens)}
        if args.quant and (args.work / "ort-quant" / "wicore.json").exists():
            try:
                speed[batch]["wicore cuda ort-quant"] = bench_wicore(args.work / "ort-quant", batch, args.new_tokens)
            except Exception as exc:
                speed[batch]["wicore cuda ort-quant"] = repr(exc)
        speed[batch]["hf eager bf16"] = bench_hf(args.gguf, batch, args.new_tokens)
        print("batch", batch, json.dumps(speed[batch]), flush=True)
    result["decode_tok_s"] = speed
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
