"""GPU check and benchmark: the engine on the CUDA EP against references, decode speed against HF.

Runs on a machine with onnxruntime-gpu and torch (see docs/HARDWARE.md for how it was run on
an H100). Everything WiCore runs goes through its Engine (sliding layers releasing their
blocks behind the window, as in serving). For the real Gemma 3 270M GGUF it:
  1. checks the engine on the GPU (fp16, 3 partitions; with two GPUs cuda:0 + cuda:1) against a
     reference that is not WiCore's GPU path: HF transformers (fp32, eager, `--reference hf`,
     the default) or WiCore's CPU fp32 engine (`--reference cpu`), on three prompts run
     concurrently, the third past the sliding window: greedy tokens, and prompt logits at every
     position (argmax agreement before and past the window);
  2. exports fp32 (1 and 3 partitions), fp16 (1 and 3, and with the paged attention) and, with
     `--quant`, ort-quant graphs, and compares greedy tokens and prompt logits of CUDA fp16
     (portable; paged, with and without CUDA graphs), CUDA fp32, a CUDA + CPU
     placement, with two GPUs a cuda:0 + cuda:1 placement, and ort-quant on CUDA and CPU,
     against the CPU fp32 engine;
  3. times batch decode (1, 8, 32 rows) of WiCore on CUDA fp16 (portable; paged, with and
     without CUDA graphs; and ort-quant) and of HF
     transformers (eager, bf16, on the same GPU), in the same run.

    python tools/bench_gpu.py --gguf model.gguf --work /tmp/wicore-gpu --json result.json
    python tools/bench_gpu.py --gguf model.gguf --engine-only --reference cpu   # step 1 only

Greedy decoding in fp16 can flip a near-tie that fp32 does not: a token difference is reported
with its first position; the prompt-logit argmax agreement says whether it is more than that.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import load_tokenizer, stream_tokens

from wicore.cli.verify import VERIFY_TEXT
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.gguf import GGUFSource
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", " ".join([VERIFY_TEXT] * 9)]
NUM_THREADS = 8


@dataclass(frozen=True)
class Outputs:
    """What one model produced for PROMPTS: greedy tokens and the logits at every prompt position."""

    devices: list[str]
    token_ids: list[list[int]]
    prompt_logits: list[np.ndarray]  # [len(prompt), vocab] float32 each
    blocks_held: dict[str, int] | None = None  # the engine's device blocks per group late in the run


def export(gguf: Path, out: Path, dtype: str, partitions: int, flavour: str = "portable", attention: str = "portable") -> Path:
    if not (out / "wicore.json").exists():
        config = ExportConfig(dtype=dtype, num_partitions=partitions, op_flavour=flavour, attention=attention)
        export_model(GGUFSource(gguf), out, config, progress=lambda _: None)
    return out


def num_gpus() -> int:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def engine_config(folder: Path, devices: str, **fields: object) -> EngineConfig:
    return EngineConfig(model_dir=folder, devices=devices, num_threads=NUM_THREADS, host_tier_gb=0.0, **fields)


def prompt_ids(folder: Path) -> list[list[int]]:
    """PROMPTS in token ids, with the tokenizer of an exported model (every export shares it)."""
    tokenizer, _ = load_tokenizer(folder)
    return [tokenizer.encode(p) for p in PROMPTS]


def engine_outputs(folder: Path, devices: str, prompts: list[list[int]], new_tokens: int, cuda_graphs: bool = False) -> Outputs:
    """Greedy tokens of the prompts run concurrently, then their prompt logits, from one Engine.

    Its device blocks per group are read at the last prompt's (the longest: its prefill ends
    last, so the others have ended) last output but one: the full group holds every block of
    the context, the window group only the window's (plus one) once the sliding layers have
    released the rest."""
    greedy = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    with Engine(engine_config(folder, devices, cuda_graphs=cuda_graphs)) as engine:
        request_ids = [engine.add_request(p, greedy) for p in prompts]
        engine.start()
        held: list[dict[str, int]] = []
        tokens = []
        for request_id in request_ids:
            ids = []
            for out in engine.outputs(request_id):
                if out.finish_reason not in (None, "length"):
                    raise RuntimeError(f"{request_id} ended with {out.finish_reason!r}: {out.error}")
                ids += out.new_token_ids
                held.append({name: g["blocks_referenced"]["device"] for name, g in engine.stats().kv_groups.items()})
            tokens.append(ids)
        logits = [c.prompt_logits for c in engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logits=True))]
        labels = [d.label for d in engine.devices]
    return Outputs(labels, tokens, logits, held[-2] if len(held) > 1 else None)


def hf_outputs(gguf: Path, prompts: list[list[int]], new_tokens: int, device: str = "cuda:0") -> Outputs:
    """HF transformers (fp32 weights from the GGUF, eager attention) on `device`, one prompt at a
    time: its prompt logits, then greedy steps on its own KV cache, EOS not stopping it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = (
        AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
        )
        .to(device)
        .eval()
    )
    tokens, logits = [], []
    with torch.inference_mode():
        for prompt in prompts:
            out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
            logits.append(out.logits[0].float().cpu().numpy())
            ids = [int(out.logits[0, -1].argmax())]
            for _ in range(new_tokens - 1):
                step = torch.tensor([[ids[-1]]], device=device)
                out = model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
                ids.append(int(out.logits[0, -1].argmax()))
            tokens.append(ids)
    return Outputs([f"hf {device} fp32"], tokens, logits)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def agreement(got: Outputs, ref: Outputs, window: int | None = None) -> dict[str, object]:
    """Per prompt: identical greedy tokens, where they first differ, and the prompt logits' max
    difference and argmax agreement (also past `window`, where sliding layers drop blocks)."""
    report: dict[str, object] = {
        "devices": got.devices,
        "identical_tokens": [t == r for t, r in zip(got.token_ids, ref.token_ids)],
        "first_divergence": [first_divergence(t, r) for t, r in zip(got.token_ids, ref.token_ids)],
        "max_abs_logit_diff": [float(np.abs(a - b).max()) for a, b in zip(got.prompt_logits, ref.prompt_logits)],
        "argmax_agreement": [float((a.argmax(-1) == b.argmax(-1)).mean()) for a, b in zip(got.prompt_logits, ref.prompt_logits)],
    }
    if window is not None:
        report["argmax_agreement_past_window"] = [
            float((a[window:].argmax(-1) == b[window:].argmax(-1)).mean()) if len(a) > window else None
            for a, b in zip(got.prompt_logits, ref.prompt_logits)
        ]
    if got.blocks_held is not None:
        report["device_blocks_held"] = got.blocks_held
    return report


def engine_check(gguf: Path, work: Path, new_tokens: int, devices: str, reference: str) -> dict:
    """The engine on the GPU(s) (fp16, 3 partitions) against HF transformers or the CPU fp32 engine."""
    folder = export(gguf, work / "fp16-p3", "fp16", 3)
    prompts = prompt_ids(folder)
    got = engine_outputs(folder, devices, prompts, new_tokens)
    if reference == "hf":
        ref = hf_outputs(gguf, prompts, new_tokens)
    else:
        ref = engine_outputs(export(gguf, work / "fp32", "fp32", 1), "cpu", prompts, new_tokens)
    window = Manifest.read(folder).config.sliding_window
    report = {
        "reference": ref.devices,
        "prompt_lengths": [len(p) for p in prompts],
        "window": window,
        **agreement(got, ref, window),
    }
    print(f"engine vs {reference}", json.dumps(report), flush=True)
    return report


def compare(gguf: Path, work: Path, new_tokens: int, quant: bool) -> dict:
    """Every placement and flavour against the CPU fp32 engine."""
    fp32 = export(gguf, work / "fp32", "fp32", 1)
    fp32_3 = export(gguf, work / "fp32-p3", "fp32", 3)
    fp16 = export(gguf, work / "fp16", "fp16", 1)
    paged = export(gguf, work / "fp16-paged", "fp16", 1, attention="paged")
    runs = [
        ("cuda fp16", fp16, "cuda:0"),
        ("cuda fp16 paged", paged, "cuda:0"),
        ("cuda fp16 paged + CUDA graphs", paged, "cuda:0"),
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
    prompts = prompt_ids(fp32)
    ref = engine_outputs(fp32, "cpu", prompts, new_tokens)
    report = {}
    for name, folder, devices in runs:
        try:
            got = engine_outputs(folder, devices, prompts, new_tokens, cuda_graphs=name.endswith("CUDA graphs"))
        except Exception as exc:  # e.g. a flavour this EP refuses: report it and go on
            report[name] = {"error": repr(exc)}
        else:
            report[name] = agreement(got, ref)
        print(name, json.dumps(report[name]), flush=True)
    report["prompt_lengths"] = [len(p) for p in prompts]
    return report


def bench_wicore(folder: Path, devices: str, batch: int, new_tokens: int, cuda_graphs: bool = False) -> float:
    """Aggregate decode tok/s of `batch` requests served together: the tokens after each
    request's first, over the time from the last first token to the last token."""
    config = engine_config(
        folder, devices, enable_prefix_cache=False, scheduler=SchedulerConfig(max_num_seqs=batch), cuda_graphs=cuda_graphs
    )
    with Engine(config).start() as engine:
        prompts = [engine.tokenizer.encode(f"Story {i}: once upon a time") for i in range(batch)]
        engine.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)

        async def serve() -> list[tuple[list[float], list[int], object]]:
            request_ids = [engine.add_request(p, params) for p in prompts]
            return list(await asyncio.gather(*(stream_tokens(engine, r, 0.0, r) for r in request_ids)))

        traces = asyncio.run(serve())
    first = max(times[0] for times, _, _ in traces)
    last = max(times[-1] for times, _, _ in traces)
    return sum(len(ids) - 1 for _, ids, _ in traces) / (last - first)


def bench_hf(gguf: Path, batch: int, new_tokens: int) -> float:
    import time

    import torch
    from transformers import AutoModelForCausalLM

    model = (
        AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, attn_implementation="eager"
        )
        .cuda()
        .eval()
    )
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
    ap.add_argument(
        "--reference",
        choices=("hf", "cpu"),
        default="hf",
        help="what the GPU engine is checked against: HF transformers fp32 on cuda:0, or WiCore's CPU fp32 engine",
    )
    ap.add_argument("--engine-only", action="store_true", help="only the engine check (step 1)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpus": num_gpus()}
    devices = "cuda:0,cuda:1,cuda:1" if result["gpus"] >= 2 else "cuda:0"
    result["engine"] = engine_check(args.gguf, args.work, args.new_tokens, devices, args.reference)
    if args.engine_only:
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    result["compare"] = compare(args.gguf, args.work, args.new_tokens, args.quant)
    speed = {}
    for batch in (int(b) for b in args.batches.split(",")):
        speed[batch] = {
            "wicore cuda fp16": bench_wicore(args.work / "fp16", "cuda:0", batch, args.new_tokens),
            "wicore cuda fp16 paged": bench_wicore(args.work / "fp16-paged", "cuda:0", batch, args.new_tokens),
            "wicore cuda fp16 paged + CUDA graphs": bench_wicore(
                args.work / "fp16-paged", "cuda:0", batch, args.new_tokens, cuda_graphs=True
            ),
        }
        if args.quant and (args.work / "ort-quant" / "wicore.json").exists():
            try:
                speed[batch]["wicore cuda ort-quant"] = bench_wicore(args.work / "ort-quant", "cuda:0", batch, args.new_tokens)
            except Exception as exc:
                speed[batch]["wicore cuda ort-quant"] = repr(exc)
        speed[batch]["hf eager bf16"] = bench_hf(args.gguf, batch, args.new_tokens)
        print("batch", batch, json.dumps(speed[batch]), flush=True)
    result["decode_tok_s"] = speed
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
