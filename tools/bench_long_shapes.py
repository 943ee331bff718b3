"""Long prompts at a named Gemma 3's real shapes on one GPU: prefill tok/s, decode ms and peak
device memory at 8K / 32K / 128K tokens, WiCore against HF transformers on the same checkpoint.

At long context a sliding layer and a full-attention layer cost differently (the first reads a
1,024-token window, the second the whole sequence), so the step is fitted per kind of layer, not
per layer. One random checkpoint of three layers is exported as three models:

    s1f1  [sliding, full]           s2f1  [sliding, sliding, full]      s1f2  [sliding, full, full]

and every figure X (prefill seconds, decode ms, peak GiB) is solved exactly from the three:

    X = fixed + sliding * S + full * F          extrapolated to the model's S and F (27B: 52 and 10)

WiCore runs one request of N random prompt tokens through the engine's own step loop (scheduler
rows, KV moves, runner), the prompt in `--prefill-chunk`-token chunks, then `--decode-steps`
greedy decode steps: prefill seconds are the sum of the prompt's steps, decode ms the median step.
Memory is the device's used memory (cudaMemGetInfo, read after every step) above what was in
use before the engine started: resident once the engine is up (weights, KV buffers of the
request's length, the sliding layers' window only), and the peak above that while it runs
(activations, ONNX Runtime's arenas). Resident memory is solved per layer like the times; the
activations are one layer's at a time, so the full depth takes the largest of the three.

With `--offload-fractions`, the same exports (then one partition a layer) also run with only that
fraction of the full-attention layers' blocks in the device tier and the rest in the host tier,
staged into the device at every step (`EngineConfig.kv_offload_tokens`, wicore.kv.offload):
the cost of a context that does not fit the device, against the same run with all of it there.
Their memory counts the stage (one layer's blocks of the whole sequence) apart from the KV.

HF transformers (bf16, sdpa, cuDNN SDPA off) prefills the same prompt in one forward
(logits_to_keep=1, its default way to run a prompt) and decodes the same steps; its peak is
torch's memory_allocated after loading and max_memory_allocated above it (a warm-up forward
first, as for WiCore). Where it runs out of memory the record says so.

    PYTHONPATH=/tmp/site:. python3 tools/bench_long_shapes.py --shape gemma3-27b \\
        --contexts 8192,32768,131072 --work /tmp/long --json long.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
from benchlib import int_list, write_record
from long_runs import GIB, Config, wicore_long
from shape_exports import VARIANTS, export, first_layers

from wicore.model.shapes import SHAPES, hf_config

MODELS = {"s1f1": (1, 1), "s2f1": (2, 1), "s1f2": (1, 2)}  # name -> (sliding layers, full layers)
T = TypeVar("T")


def make_checkpoints(config: Config) -> dict[str, Path]:
    """One random bf16 checkpoint of three layers; a folder per model of MODELS sharing its weights."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    full = config.work / f"{config.shape}-hf3"
    if not (full / "config.json").is_file():
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = Gemma3ForCausalLM(Gemma3TextConfig(**hf_config(config.shape, 3)))
        torch.set_default_dtype(torch.float32)
        model.save_pretrained(full)
        del model
    return {
        name: first_layers(
            full, config.work / f"{config.shape}-hf-{name}", s + f, ["sliding_attention"] * s + ["full_attention"] * f
        )
        for name, (s, f) in MODELS.items()
    }


def hf_long(folder: Path, context: int, config: Config) -> dict[str, object]:
    """The same with HF transformers bf16 sdpa: one forward over the prompt, then greedy steps."""
    import torch
    from transformers import Gemma3ForCausalLM

    torch.backends.cuda.enable_cudnn_sdp(False)  # see bench_shapes.hf_steps
    model = Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda").eval()
    resident = torch.cuda.memory_allocated()
    rng = np.random.default_rng(context)
    with torch.no_grad():  # warm-up
        model(torch.tensor([rng.integers(1000, model.config.vocab_size, 4096).tolist()], device="cuda"), logits_to_keep=1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ids = torch.tensor([rng.integers(1000, model.config.vocab_size, context).tolist()], device="cuda")
    try:
        with torch.no_grad():
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - start
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(config.decode_steps):
                start = time.perf_counter()
                token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                steps.append(time.perf_counter() - start)
        result: dict[str, object] = {
            "prefill_s": prefill,
            "decode_ms": 1000 * statistics.median(steps[2:] or steps),
            "weights_gib": resident / GIB,
            "activations_gib": (torch.cuda.max_memory_allocated() - resident) / GIB,
        }
    except torch.OutOfMemoryError as exc:
        result = {"oom": str(exc).splitlines()[0]}
    finally:
        del model
        torch.cuda.empty_cache()
    return result


def isolated(measure: Callable[..., T], folder: Path, context: int, config: Config, *more: object) -> T:
    """measure(folder, context, config, *more) in a process of its own: device memory that an earlier
    measurement's ONNX Runtime arenas or torch's cache still hold cannot count."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (folder, context, config, *more))


def solve(by_model: dict[str, dict[str, float]], sliding: int, full: int) -> dict[str, float]:
    """Each figure as fixed + a * sliding + b * full, solved from MODELS' three, at (sliding, full):
    times; weights and KV bytes (exact); HF's activations (its KV cache grows with the layers).
    WiCore's memory beyond weights and KV (activations, arenas, CUDA graphs' pools) is not summed
    over layers but reused by each: the full depth takes the largest measured."""
    names = list(MODELS)
    a = np.array([[1.0, *MODELS[n]] for n in names])
    out = {}
    for key in ("prefill_s", "decode_ms", "weights_gib", "kv_gib", "activations_gib"):
        if key not in by_model[names[0]]:
            continue
        fixed, per_sliding, per_full = np.linalg.solve(a, np.array([by_model[n][key] for n in names]))
        out[key] = float(fixed + per_sliding * sliding + per_full * full)
        out[f"{key}_per_sliding_layer"], out[f"{key}_per_full_layer"] = float(per_sliding), float(per_full)
    if "overhead_gib" in by_model[names[0]]:
        out["overhead_gib"] = max(by_model[n]["overhead_gib"] for n in names)
        out["stage_gib"] = max(by_model[n].get("stage_gib", 0.0) for n in names)  # one stage, whatever the depth
        out["peak_gib"] = out["weights_gib"] + out["kv_gib"] + out["stage_gib"] + out["overhead_gib"]
    else:
        out["peak_gib"] = out["weights_gib"] + out["activations_gib"]
    return out


def run(config: Config) -> int:
    config.work.mkdir(parents=True, exist_ok=True)
    folders = make_checkpoints(config)
    depth = int(SHAPES[config.shape]["depth"])  # type: ignore[call-overload]
    num_full = depth // 6
    results: dict[str, dict[int, object]] = {}
    if config.hf:  # first: ONNX Runtime's CUDA arenas are not handed back to torch when a session closes
        hf: dict[int, object] = {}
        for context in config.contexts:
            per_model = {name: isolated(hf_long, folders[name], context, config) for name in MODELS}
            print(f"  HF context {context}: {per_model}", flush=True)
            fine = all("oom" not in r for r in per_model.values())
            hf[context] = {"models": per_model, **({"full_depth": solve(per_model, depth - num_full, num_full)} if fine else {})}  # type: ignore[arg-type]
        results["hf-sdpa-bf16"] = hf
    split = bool(config.offload_fractions)  # a partition a layer: the full layers share one stage
    for variant in config.variants:
        dirs = {
            name: export(folders[name], variant, config.work / f"{config.shape}-{name}-{variant}{'-split' if split else ''}", sum(MODELS[name]) if split else 1)
            for name in MODELS
        }  # fmt: skip
        for fraction in (None, *config.offload_fractions):
            label = variant if fraction is None else f"{variant}+offload{round(100 * fraction)}"
            runs: dict[int, object] = {}
            results[label] = runs
            for context in config.contexts:
                per_model = {name: isolated(wicore_long, dirs[name], context, config, fraction) for name in MODELS}
                if fraction is not None:  # every token is still attended: the all-device run's tokens
                    device = results[variant][context]["models"]  # type: ignore[index]
                    for name, r in per_model.items():
                        r["same_tokens_as_all_on_device"] = r["tokens"] == device[name]["tokens"]
                shown = {n: {k: v for k, v in r.items() if k != "tokens"} for n, r in per_model.items()}
                print(f"  {label} context {context}: {shown}", flush=True)
                runs[context] = {"models": per_model, "full_depth": solve(per_model, depth - num_full, num_full)}
    print(f"\n{config.shape}: {depth - num_full} sliding + {num_full} full layers (solved from {', '.join(MODELS)}), batch 1")
    print("| | context | prefill s | prefill tok/s | decode ms | peak GiB (weights + KV + rest) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        for context, r in runs.items():
            f = r.get("full_depth")  # type: ignore[union-attr]
            if f is None:
                print(f"| {name} | {context} | out of memory | | | |")
                continue
            rest = f.get("overhead_gib", f.get("activations_gib")) + f.get("stage_gib", 0.0)
            kv = f"{f['kv_gib']:.1f}" if "kv_gib" in f else "(in rest)"
            print(
                f"| {name} | {context} | {f['prefill_s']:.2f} | {context / f['prefill_s']:.0f} | {f['decode_ms']:.1f} | "
                f"{f['peak_gib']:.1f} ({f['weights_gib']:.1f} + {kv} + {rest:.1f}) |"
            )
    if config.json_path is not None:
        write_record(config.json_path, config, results=results)
    return 0


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b", choices=sorted(SHAPES))
    p.add_argument("--contexts", default="8192,32768,130944", help="prompt lengths in tokens")
    p.add_argument("--variants", default="paged", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="prompt tokens a step (the engine's prefill chunk)")
    p.add_argument("--decode-steps", type=int, default=40, help="greedy decode steps after the prompt")
    p.add_argument("--devices", default="cuda:0", help="as wicore's --devices")
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-long"), help="checkpoints and exports (kept, reused)")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip the HF transformers peer")
    p.add_argument(
        "--offload-fractions",
        default="",
        help="also run with this share of the full layers' KV on the device and the rest offloaded from the host "
        "tier (comma-separated, e.g. 0.5,0.25; exports one partition a layer)",
    )
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    fractions = tuple(float(f) for f in a.offload_fractions.split(",") if f)
    if any(not 0 < f < 1 for f in fractions):
        raise SystemExit("error: --offload-fractions between 0 and 1")
    variants = tuple(a.variants.split(","))
    if any(v not in VARIANTS for v in variants) or a.prefill_chunk < 1 or a.decode_steps < 1:
        raise SystemExit(f"error: --variants of {', '.join(VARIANTS)}; --prefill-chunk and --decode-steps positive")
    return Config(
        a.shape, int_list(a.contexts), variants, a.prefill_chunk, a.decode_steps, a.devices, a.work, a.hf, a.json, fractions
    )


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
