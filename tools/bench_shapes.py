"""Decode speed at a named model's real shapes on one GPU, WiCore against HF transformers, same run.

Builds a random-weight Hugging Face checkpoint with the model's shapes (hidden size, heads, MLP,
vocabulary, sliding pattern) and `max(--layers)` layers, exports it with WiCore's exporter once per
layer count and variant, and times decode steps on the CUDA EP through the engine's own parts
(tools/profile_step.py: scheduler rows, the window release, the runner with its sampling). HF
transformers (bf16, sdpa, DynamicCache, argmax on the device) decodes the same checkpoint in the
same run. Per-layer cost is fitted over the layer counts and extrapolated to the model's depth:

    step ms (L layers) = fixed + per_layer * L        (least squares; residuals in the JSON)

(One layer count: its measured step times, no fit.) With `--random-weights` each variant is exported
from random weights with no checkpoint (shape_exports.random_export: blocks for quantized variants,
floats for fp16 ones), so one layer count can be the full depth, measured instead of fitted (no HF
peer, no --check: there is no checkpoint to run).

Shapes: Gemma 3's (wicore.model.shapes) and mixtures of experts (tools/moe_shapes.py: Qwen3-30B-A3B,
its floor then the weights one token reads, batch 1's). The first L layers of the model's pattern are exported (the last made a full-attention layer),
so the fit holds where a sliding and a full layer cost alike: short contexts, where both read
the same tokens. At long context a full layer reads the whole sequence and a sliding one its
window: tools/bench_long_shapes.py solves the two kinds apart instead.

    floor ms           weight bytes of the full model / the device's measured copy bandwidth

With `--check`, the first layer count's exports also run one `--check-tokens` prompt (past the
sliding window) for logits at every position, against HF in float32: argmax agreement and the
largest absolute difference.

    PYTHONPATH=. python tools/bench_shapes.py --shape gemma3-27b --layers 2,8 --variants portable,paged \\
        --batch 1,8,32,64 --context 512 --work /tmp/shapes --check --json docs/results/shapes.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from benchlib import int_list, write_record
from hf_peers import hf_compiled_steps, hf_steps
from moe_shapes import MOE_SHAPES, active_weight_bytes
from moe_shapes import depth as moe_depth
from shape_exports import VARIANTS, export, make_checkpoints, random_export
from step_timing import Config as StepConfig
from step_timing import decode_steps, engine_config

from wicore.engine.engine import Engine
from wicore.model.shapes import SHAPES
from wicore.types.sampling import SamplingParams

# Run-time flags after a variant's name ("int4-paged+graphs+nofpa"): the same export, run with these.
FLAGS = {
    "graphs": "CUDA graphs (EngineConfig.cuda_graphs)",
    "nofpa": "ORT_FPA_INTB_GEMM=0: MatMulNBits on its default kernels, not the CUTLASS fpA_intB ones WiCore turns on",
    "tune": "ORT_CUDA_GEMM_AUTO_TUNE=1: ONNX Runtime times cuBLAS against its small-row GEMV kernels per MatMul shape",
    "cudnn": "ORT_ENABLE_CUDNN_FLASH_ATTENTION=1: the paged attention may decode on cuDNN's paged SDPA",
}
# The flags that are ONNX Runtime switches read from the environment when a session is created.
ENV_FLAGS = {
    "nofpa": ("ORT_FPA_INTB_GEMM", "0"),
    "tune": ("ORT_CUDA_GEMM_AUTO_TUNE", "1"),
    "cudnn": ("ORT_ENABLE_CUDNN_FLASH_ATTENTION", "1"),
}


def split_variant(variant: str) -> tuple[str, set[str]]:
    """'int4-paged+graphs+nofpa' -> ('int4-paged', {'graphs', 'nofpa'})."""
    base, *flags = variant.split("+")
    return base, set(flags)


@dataclass(frozen=True)
class Config:
    shape: str
    layers: tuple[int, ...]
    variants: tuple[str, ...]
    batches: tuple[int, ...]
    context: int
    steps: int
    work: Path
    hf: bool
    check: bool
    check_tokens: int
    json_path: Path | None
    hf_compiled: bool = False
    temperature: float = 0.0  # WiCore's rows sample (--top-k, --top-p) instead of taking the argmax
    top_k: int = 0
    top_p: float = 0.95
    threads: int = 1
    block_size: int | None = None  # None: the engine's default (a paged export: its FlashAttention tile)
    random_weights: bool = False  # exports from random weights, no checkpoint (the full depth fits)


def wicore_steps(model_dir: Path, config: Config, flags: set[str]) -> dict[int, float]:
    """Median decode step ms per batch size (an engine per batch size, as tools/profile_step.py)."""
    for flag, (name, value) in ENV_FLAGS.items():  # read when each session is created
        os.environ.pop(name, None)
        if flag in flags:
            os.environ[name] = value
    step = StepConfig(
        (str(model_dir),), config.batches, config.context, 1, config.steps, "cuda:0", False, None,
        block_size=config.block_size, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
    )  # fmt: skip
    times = {}
    for batch in config.batches:
        with Engine(replace(engine_config(model_dir, batch, step), cuda_graphs="graphs" in flags)) as engine:
            times[batch] = 1000 * statistics.median(decode_steps(engine, batch, step).step_seconds)
        print(f"  {model_dir.name} batch {batch}: {times[batch]:.2f} ms", flush=True)
    return times


# The check's decodes: greedy, and seeded draws through each path of the sampling head (a whole
# distribution: the graph's inverse CDF; top-k: its candidates; top-p: on random weights a nucleus
# past the candidates, so the logits); the same tokens wherever the logits are the same.
DECODES: dict[str, dict[str, object]] = {
    "greedy": {},
    "sampled": {"temperature": 1.0, "seed": 5},
    "top-k": {"temperature": 0.8, "top_k": 40, "seed": 6},
    "top-p": {"temperature": 1.0, "top_p": 0.95, "seed": 7},
}
# a variant's logits and tokens are also checked against its twin's (when both run): the same graphs but
# for the sampling head, or but for WiCore's BlockAttention on the sliding layers (on every layer)
TWINS = {
    "paged": "paged-nohead",
    "paged-wicore-block": "paged-wicore",
    "paged-wicore-all": "paged-wicore",
    # WiCore's norms and GeGLU against ORT's ops; MatMulQ16 and MatMulI8 against MatMulNBits
    "int4-paged-wicore": "int4-paged",
    "int8-paged-wicore": "int8-paged",
    "int4-paged-q16": "int4-paged-wicore",
    "int8-paged-q16": "int8-paged-wicore",
    "int8-paged-i8": "int8-paged-wicore",  # MatMulI8 (W8A8 above 16 rows) against MatMulNBits (W8A16)
}


def check(folder: Path, model_dirs: dict[str, Path], num_tokens: int, block_size: int | None) -> dict[str, dict[str, object]]:
    """Prompt logits at every position of one random prompt: each export against HF float32; and
    24 tokens of four prompts decoded together (DECODES), which a "+graphs" variant must repeat
    (and a variant those of its TWINS one, with the largest logit difference between the two)."""
    import torch
    from transformers import AutoModelForCausalLM

    rng = np.random.default_rng(7)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", device_map="cuda"
    ).eval()
    vocab = model.config.vocab_size
    prompt = rng.integers(1000, vocab, num_tokens).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([prompt], device="cuda")).logits[0].float().cpu().numpy()
    del model
    torch.cuda.empty_cache()
    prompts = [rng.integers(1000, vocab, n).tolist() for n in (5, 40, 300, 1030)]
    report: dict[str, dict[str, object]] = {}
    logits: dict[str, np.ndarray] = {}
    for variant, model_dir in model_dirs.items():
        # the pool holds the longest of the prompts, also where --check-tokens is shorter (1030 > 1024 stopped a run)
        context = max(num_tokens, *map(len, prompts))
        step = StepConfig((), (1,), context, 1, 24, "cuda:0", False, None, block_size=block_size)
        engine_cfg = engine_config(model_dir, 4, step)
        base, flags = split_variant(variant)
        with Engine(replace(engine_cfg, cuda_graphs="graphs" in flags)) as engine:
            got = engine.generate([prompt], SamplingParams(max_tokens=1, prompt_logits=True))[0].prompt_logits
            decoded = {
                kind: [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True, **params))]  # type: ignore[arg-type]
                for kind, params in DECODES.items()
            }
        assert got is not None
        agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
        report[variant] = {"argmax_agreement": agree, "max_abs_diff": float(np.abs(got - ref).max()), **decoded}
        logits[variant] = got
        same = ""
        twin = TWINS.get(base) if flags <= {"graphs"} else None
        twin = next((v for v in (f"{twin}+graphs" if "graphs" in flags else None, twin) if v in report), None)
        if twin is not None:
            report[variant]["twin"] = twin
            report[variant]["max_abs_diff_twin"] = float(np.abs(got - logits[twin]).max())
            same += f"; max |diff| against {twin} {report[variant]['max_abs_diff_twin']:.4f}"
        for name in (base if flags else None, twin):
            if name in report:  # tokens up to each row's first difference, over all
                same += f"; against {name}:" + ",".join(f" {kind} {_kept(decoded[kind], report[name][kind])}" for kind in DECODES)  # type: ignore[arg-type]
        print(
            f"  check {variant}: argmax agreement {agree:.4f}, max |diff| {report[variant]['max_abs_diff']:.4f}{same}", flush=True
        )
    return report


def _kept(mine: list[list[int]], theirs: list[list[int]]) -> str:
    """'k / n': the tokens of `mine` before each row's first difference from `theirs`, of all."""
    kept = sum(next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(mine, theirs))
    return f"{kept} / {sum(map(len, mine))}"


def copy_bandwidth() -> float:
    """Bytes a second the GPU reads and writes in a device-to-device copy of 4 GiB."""
    import torch

    a = torch.empty(1 << 31, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * 2 * 5 / (time.perf_counter() - start)


def measured(times: dict[int, dict[int, float]], depth: int) -> dict[str, object]:
    """A result's record: its step times per layer count, and their fit to `depth` where two or more counts ran."""
    return {"ms": times, "fit": fit(times, depth)} if len(times) > 1 else {"ms": times}


def fit(times: dict[int, dict[int, float]], depth: int) -> dict[int, dict[str, float]]:
    """Per batch size: fixed + per_layer * L over the layer counts, and the estimate at `depth`."""
    fits = {}
    for batch in next(iter(times.values())):
        layers = np.array(sorted(times), dtype=np.float64)
        ms = np.array([times[n][batch] for n in sorted(times)])
        per_layer, fixed = np.polyfit(layers, ms, 1)
        residual = float(np.abs(fixed + per_layer * layers - ms).max())
        full = fixed + per_layer * depth
        fits[batch] = {"fixed_ms": fixed, "per_layer_ms": per_layer, "max_residual_ms": residual, "full_ms": full,
                       "full_tokens_per_s": batch / full * 1000}  # fmt: skip
    return fits


def weight_bytes(shape: str, bytes_per_weight: float) -> float:
    """The weights a decode step reads (a mixture of experts: one token's, batch 1's floor)."""
    if shape in MOE_SHAPES:
        return active_weight_bytes(shape, bytes_per_weight)
    s = SHAPES[shape]
    h, inter, hd = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    attn = h * hd * (2 * s["num_attention_heads"] + 2 * s["num_key_value_heads"])  # type: ignore[operator]
    per_layer = attn + 3 * h * inter  # type: ignore[operator]
    return (per_layer * s["depth"] + h * s["vocab_size"]) * bytes_per_weight  # type: ignore[operator]


def shape_depth(shape: str) -> int:
    return moe_depth(shape) if shape in MOE_SHAPES else int(SHAPES[shape]["depth"])


def run(config: Config) -> int:
    config.work.mkdir(parents=True, exist_ok=True)
    exports = {}
    if config.random_weights:
        for n in config.layers:
            for v in config.variants:
                base = split_variant(v)[0]
                exports[n, v] = random_export(config.shape, n, base, config.work / f"{config.shape}-{n}-{base}-random")
    else:
        folders = make_checkpoints(config.shape, config.layers, config.work)
        for n in config.layers:
            for v in config.variants:
                base = split_variant(v)[0]
                exports[n, v] = export(folders[n], base, config.work / f"{config.shape}-{n}-{base}")
    report: dict[str, object] = {}
    if config.check:
        n = config.layers[0]
        report["check"] = check(folders[n], {v: exports[n, v] for v in config.variants}, config.check_tokens, config.block_size)
    depth = shape_depth(config.shape)
    results: dict[str, dict[str, object]] = {}
    if config.hf:  # first: ONNX Runtime's CUDA arenas are not handed back to torch when a session closes
        times = {n: hf_steps(folders[n], config) for n in config.layers}
        results["hf-sdpa-bf16"] = measured(times, depth)
    if config.hf_compiled:  # at the largest layer count only: each compile takes a minute or more
        n = max(config.layers)
        results["hf-compiled-bf16"] = {"ms": {n: hf_compiled_steps(folders[n], config)}}
    for variant in config.variants:
        times = {n: wicore_steps(exports[n, variant], config, split_variant(variant)[1]) for n in config.layers}
        results[variant] = measured(times, depth)
    bandwidth = copy_bandwidth()
    floor_ms = 1000 * weight_bytes(config.shape, 2) / bandwidth
    header = "| | " + " | ".join(f"batch {b}" for b in config.batches) + " |\n|---|" + "---:|" * len(config.batches)
    print(f"\nfp16 weight-read floor {floor_ms:.1f} ms at the measured copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    if len(config.layers) > 1:
        print(
            f"\n{config.shape}, {depth} layers (fitted over {config.layers}), context {config.context}, "
            f"blocks of {config.block_size or 'the engine default'}; ms a decode step (tok/s)\n\n{header}"
        )
    for name, r in results.items():
        if "fit" in r:
            cells = [f"{f['full_ms']:.1f} ({f['full_tokens_per_s']:.0f})" for f in r["fit"].values()]  # type: ignore[union-attr]
            print(f"| {name} | " + " | ".join(cells) + " |")
    if len(config.layers) == 1:  # measured, not fitted
        n = config.layers[0]
        print(f"\n{config.shape}, measured at {n} layers, context {config.context}; ms a decode step (tok/s)\n\n{header}")
        for name, r in results.items():
            ms: dict[int, float] = r["ms"][n]  # type: ignore[index]
            if set(ms) == set(config.batches):
                print(f"| {name} | " + " | ".join(f"{ms[b]:.2f} ({b / ms[b] * 1000:.0f})" for b in config.batches) + " |")
    if config.json_path is not None:
        write_record(config.json_path, config, floor_ms=floor_ms, copy_bandwidth=bandwidth, results=results, **report)
    return 0


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b", choices=sorted([*SHAPES, *MOE_SHAPES]))
    p.add_argument("--layers", default="2,8", help="layer counts to export and time (two or more: fitted to the depth)")
    p.add_argument(
        "--variants",
        default="portable,paged",
        help=f"comma-separated, of {', '.join(VARIANTS)}; flags after one: " + "; ".join(f"+{k}: {v}" for k, v in FLAGS.items()),
    )
    p.add_argument("--batch", default="1,8,32", help="batch sizes (rows decoding together)")
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each row before the timed decode steps")
    p.add_argument("--steps", type=int, default=20, help="timed decode steps per point")
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-shapes"), help="checkpoints and exports (kept, reused)")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip the HF transformers peer")
    p.add_argument(
        "--hf-compiled", action="store_true", help="also HF with a static cache under torch.compile, at the largest layer count"
    )
    p.add_argument("--check", action="store_true", help="compare prompt logits with HF float32 first")
    p.add_argument("--check-tokens", type=int, default=1100)
    p.add_argument("--block-size", type=int, default=None, help="KV block (page) size in tokens (default: the engine's)")
    p.add_argument("--temperature", type=float, default=0.0, help="WiCore's rows sample at this temperature")
    p.add_argument("--top-k", type=int, default=0, help="with --temperature: top-k of the rows' draws (0: off)")
    p.add_argument("--top-p", type=float, default=0.95, help="with --temperature: top-p of the rows' draws")
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="exports from random weights, no checkpoint: the full depth fits a device's disk",
    )
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    layers, variants = int_list(a.layers), tuple(a.variants.split(","))
    parts = [split_variant(v) for v in variants]
    if len(set(layers)) != len(layers) or any(base not in VARIANTS or not flags <= FLAGS.keys() for base, flags in parts):
        raise SystemExit("error: --layers: distinct counts; --variants: " + ", ".join(VARIANTS) + ", flags " + ", ".join(FLAGS))
    if a.random_weights and (a.hf or a.hf_compiled or a.check):
        raise SystemExit("error: --random-weights has no float checkpoint: add --no-hf, leave out --hf-compiled and --check")
    return Config(
        a.shape, layers, variants, int_list(a.batch), a.context, a.steps, a.work, a.hf, a.check, a.check_tokens, a.json,
        hf_compiled=a.hf_compiled, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, block_size=a.block_size,
        random_weights=a.random_weights,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run(parse_args(None)))
