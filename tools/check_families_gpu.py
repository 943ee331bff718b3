"""Every decoder family on the CUDA EP: tiny random models of each family (HF
transformers, saved as safetensors), each exported as fp32 portable graphs and as fp16 paged
graphs (ONNX Runtime's PagedAttention), prompt logits of three batched prompts of different
lengths (past the sliding window where there is one) against HF transformers in float32; the paged
exports on WiCore's kernels (TWINS) also against the same graphs on ONNX Runtime's: logits and greedy tokens
(the `-block`, `-all` and `-auto` exports: the attention on WiCore's BlockAttention, on the sliding layers,
on every layer, and where `--block-attention auto` puts it, against fp16-paged-wicore's ORT attention).
The tiny models themselves: tools/family_models.py.

    PYTHONPATH=/tmp/site:. python3 tools/check_families_gpu.py --work /tmp/families --json families.json

Prints, per family and export: max |logit - HF| and argmax agreement; exits 1 where a logit
differs from HF's by more than 0.05 (the CUDA EP's float32 MatMuls run in TF32: ~1e-2 on the
tiny Gemma 3's logits; a paged sliding window one token short gave 0.8-1.7), more than 0.075 for
gpt_oss and 0.1 for mixtral (TF32 flips an expert at a near-tie: MAX_ABS_DIFF_OF, `--tf32-emulation`).

With --serve, each export is also served by a real `wicore serve` process on the first of
--devices (a free port), sent three greedy /v1/completions requests at once (SERVE_PROMPT_LENGTHS:
past Gemma 2's window, across Phi-3 LongRoPE's switch while generating, short), and the text must
be HF `generate`'s (float32, CPU) exactly (family_serving.py: the checkpoints get an id tokenizer).
The paged families of issue 33 in one command (about 4 minutes on an H200 is the aim):

    PYTHONPATH=/tmp/site:.:tools python3 tools/check_families_gpu.py --families \
        gemma2,mistral-sliding,phi3,phi3-longrope,olmo2,gpt_oss --exports fp16-paged --no-sampled --serve
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from benchlib import write_record
from family_models import FAMILIES, SHAPE, build, tf32_emulation
from family_serving import hf_greedy_text, served_greedy_text, serving

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.errors import UnsupportedModelError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

EXPORTS = {
    "fp32-portable": ExportConfig(),
    "fp16-paged": ExportConfig(dtype="fp16", attention="paged"),
    # the residual norms and gated MLP on WiCore's own kernels (wicore/kernels), the attention on ORT's PagedAttention:
    # its greedy tokens must be fp16-paged's
    "fp16-paged-wicore": ExportConfig(dtype="fp16", attention="paged", kernels="wicore", block_attention="off"),
    # and the sliding layers on WiCore's BlockAttention (graph/paged_block.py): fp16-paged-wicore's tokens, its logits
    # within MAX_ABS_DIFF of them
    "fp16-paged-wicore-block": ExportConfig(dtype="fp16", attention="paged", kernels="wicore", block_attention="sliding"),
    # every layer on it (full-attention layers too; sinks keep ORT's op): the same against fp16-paged-wicore
    "fp16-paged-wicore-all": ExportConfig(dtype="fp16", attention="paged", kernels="wicore", block_attention="all"),
    # what `--block-attention auto` picks for this export (ExportConfig.resolved_block_attention)
    "fp16-paged-wicore-auto": ExportConfig(dtype="fp16", attention="paged", kernels="wicore"),
}
# an export's greedy tokens must be its twin's (the same graphs but for one kernel), when both run
TWINS = {
    "fp16-paged-wicore": "fp16-paged",
    **{f"fp16-paged-wicore-{mode}": "fp16-paged-wicore" for mode in ("block", "all", "auto")},
}
GREEDY_TOKENS = 24
# Sampled decodes a paged export must repeat with and without CUDA graphs (the sampling head runs
# on a replayed bucket's logits, uncaptured: wicore/executor/sampling_head.py).
SAMPLED = {
    "temperature": SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True, temperature=1.0, seed=5),
    "top-k": SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True, temperature=0.8, top_k=40, seed=6),
    "top-p": SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True, temperature=1.0, top_p=0.95, seed=7),
}
# transformers picks LongRoPE's factors per forward, WiCore per step: the long prompt in one chunk
PREFILL_CHUNK = {"phi3-longrope": 1024}
PROMPT_LENGTHS = (700, 40, 7)  # the first past Gemma's window of 64, and past blocks its window group releases
# --serve: the 500-token prompt crosses phi3-longrope's switch (512) at its 13th token
SERVE_PROMPT_LENGTHS = (700, 500, 7)
MAX_ABS_DIFF = 0.05
# A mixture of experts flips a router's top-k choice at a near-tie under TF32 (the CUDA EP's float32
# MatMuls), and one token's expert swapped moves its logits far more than rounding does elsewhere.
# HF's own float32 run with its matmul inputs rounded to TF32 on the CPU (`--tf32-emulation`, no GPU)
# moves the 700-token prompt's logits by 5.03e-2 (gpt_oss) and 6.9e-2 (mixtral; qwen3_moe 4.2e-3,
# the dense families < 2.4e-3, 2026-11-28): gpt_oss measured 5.03e-2 on an H100 and an H200, mixtral
# 6.2e-2 (portable) and 7.5e-2 (paged, fp16 besides). Their bound: that emulation's value x 1.5.
MAX_ABS_DIFF_OF = {"gpt_oss": 0.075, "mixtral": 0.1}


@dataclass(frozen=True)
class Config:
    families: str
    devices: str
    exports: str
    sampled: bool = True
    serve: bool = False
    serve_flags: str = ""


def check(
    work: Path,
    name: str,
    prompts: list[list[int]],
    devices: str,
    exports: list[str],
    sampled_check: bool = True,
    serve_prompts: list[list[int]] | None = None,
    serve_flags: Sequence[str] = (),
) -> dict[str, dict[str, object]]:
    """`serve_prompts`: also serve each export (`wicore serve` with `serve_flags`) and compare its
    greedy text with HF's."""
    import torch

    folder, model, tokenizer = build(work, name)
    with torch.no_grad():
        refs = [model(torch.tensor([p])).logits[0].float().numpy() for p in prompts]
    report = {}
    logits: dict[str, list[np.ndarray]] = {}
    for label in exports:
        config = EXPORTS[label]
        out = work / f"{name}-{label}"
        try:
            export_model(open_source(str(folder)), out, replace(config, overwrite=True), progress=lambda _: None)
        except UnsupportedModelError as exc:  # the paged graphs lack the family's mechanism
            print(f"{name:7s} {label:14s} refused: {exc}", flush=True)
            continue
        engine_config = EngineConfig(
            model_dir=out,
            devices=devices,
            num_host_blocks=0,
            num_nvme_blocks=0,
            scheduler=SchedulerConfig(prefill_chunk=PREFILL_CHUNK.get(name, SchedulerConfig.prefill_chunk)),
        )
        with Engine(engine_config) as engine:
            got = engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logits=True))
            greedy = engine.generate(prompts, SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True))
            twin_tokens = report.get(TWINS.get(label, ""), {}).get("greedy_tokens")
            split = divergences(engine, model, prompts, [c.token_ids for c in greedy], twin_tokens) if twin_tokens else []
        if config.attention == "paged" and sampled_check:  # sampled rows: captured decode steps against uncaptured ones
            sampled = {}
            for graphs in (True, False):
                with Engine(replace(engine_config, cuda_graphs=graphs)) as engine:
                    sampled[graphs] = {k: [c.token_ids for c in engine.generate(prompts, p)] for k, p in SAMPLED.items()}
            same = {k: sampled[True][k] == sampled[False][k] for k in SAMPLED}
            print(f"{name:7s} {label:14s} sampled tokens with CUDA graphs as without: {same}", flush=True)
        diffs = [float(np.abs(c.prompt_logits - r).max()) for c, r in zip(got, refs, strict=True)]
        agree = np.concatenate([c.prompt_logits.argmax(-1) == r.argmax(-1) for c, r in zip(got, refs, strict=True)])
        logits[label] = [c.prompt_logits for c in got]
        report[label] = {
            "max_abs_diff": max(diffs),
            "argmax_agreement": float(agree.mean()),
            "greedy_tokens": [c.token_ids for c in greedy],
        }
        if config.attention == "paged" and sampled_check:
            report[label]["sampled_same_with_graphs"] = all(same.values())
        if twin_tokens:
            report[label]["divergences_from_twin"] = split
        for d in split:
            print(
                f"{name:7s} {label:14s} greedy tokens part from {TWINS[label]}'s: prompt {d['prompt']} step {d['step']}, "
                f"{d['tokens'][0]} against {d['tokens'][1]}: {d['margin']:+.2e} apart in this export's logits, "
                f"{d['margin_hf']:+.2e} in HF float32's (its top two {d['hf_top2_gap']:.2e} apart)",
                flush=True,
            )
        twin = f" (against {TWINS.get(label)}: n/a)"
        if TWINS.get(label) in logits:
            pairs = zip(logits[label], logits[TWINS[label]], strict=True)
            report[label]["max_abs_diff_twin"] = max(float(np.abs(a - b).max()) for a, b in pairs)
            twin = f" (against {TWINS[label]}: {report[label]['max_abs_diff_twin']:.2e})"
        print(f"{name:7s} {label:14s} max |diff| {max(diffs):.2e}{twin}  argmax agreement {agree.mean():.4f}", flush=True)
        if serve_prompts:
            expected = hf_greedy_text(model, tokenizer, serve_prompts, GREEDY_TOKENS)
            with serving(out, devices.split(",")[0], serve_flags) as url:
                got_text = served_greedy_text(url, serve_prompts, GREEDY_TOKENS)
            equal = [a == b for a, b in zip(got_text, expected, strict=True)]
            report[label]["served_greedy_equal"] = equal
            report[label]["served_text"] = got_text
            report[label]["hf_text"] = expected
            report[label]["served_first_difference"] = [first_difference(a, b) for a, b in zip(got_text, expected, strict=True)]
            print(f"{name:7s} {label:14s} wicore serve's greedy text equal to HF generate's: {equal}", flush=True)
            for a, b in zip(got_text, expected, strict=True):
                if a != b:
                    print(f"    served {a!r}\n    HF     {b!r}", flush=True)
    return report


def divergences(
    engine: Engine, model: object, prompts: list[list[int]], mine: list[list[int]], theirs: list[list[int]]
) -> list[dict[str, object]]:
    """Where this export's greedy tokens part from its twin's: each such prompt's first differing step, and how
    far apart the two tokens are there, in this export's logits (the prompt and the common tokens as one
    prompt: its prefill's logits, not the decode step's) and in HF float32's. Both near 0: a near-tie that
    rounding can turn either way; HF's far from 0 with the twin's token ahead: this export chose wrong."""
    import torch

    found = []
    for i, (prompt, a, b) in enumerate(zip(prompts, mine, theirs, strict=True)):
        step = next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if step is None:
            continue
        prefix = prompt + a[:step]
        (c,) = engine.generate([prefix], SamplingParams(max_tokens=1, prompt_logits=True))
        ours = c.prompt_logits[-1]
        with torch.no_grad():
            hf = model(torch.tensor([prefix])).logits[0, -1].float().numpy()  # type: ignore[operator]
        top2 = np.sort(hf)[-2:]
        found.append(
            {
                "prompt": i,
                "step": step,
                "tokens": [a[step], b[step]],
                "margin": float(ours[a[step]] - ours[b[step]]),
                "margin_hf": float(hf[a[step]] - hf[b[step]]),
                "hf_top2_gap": float(top2[1] - top2[0]),
            }
        )
    return found


def reference_versions() -> dict[str, str]:
    """The versions that computed HF's side (the GPU image's transformers 5.17 gave another greedy text
    than 5.24 across LongRoPE's switch: family_serving.hf_greedy_text)."""
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def first_difference(served: str, hf: str) -> int | None:
    """The index of the first generated token where an id tokenizer's texts differ ("<12><7>..."), or None."""
    pairs = zip(served.split(">"), hf.split(">"), strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-families"))
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--devices", default="cuda:0")
    p.add_argument("--exports", default=",".join(EXPORTS), help=f"of {', '.join(EXPORTS)}")
    p.add_argument(
        "--sampled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="paged exports: also compare sampled decodes with and without CUDA graphs (two more engines an export)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="also serve each export through `wicore serve` and compare 3 greedy completions with HF generate's text",
    )
    p.add_argument(
        "--serve-flags",
        default="",
        help="more `wicore serve` flags for --serve, e.g. '--cuda-graphs off' (decode steps uncaptured)",
    )
    p.add_argument(
        "--tf32-emulation",
        action="store_true",
        help="only print how far TF32 alone moves HF float32's logits of each family (on the CPU: MAX_ABS_DIFF_OF)",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, SHAPE["vocab_size"], n).tolist() for n in PROMPT_LENGTHS]
    if args.tf32_emulation:
        for name in args.families.split(","):
            diffs = ", ".join(f"{d:.2e}" for d in tf32_emulation(args.work, name, prompts))
            print(f"{name:15s} HF float32 with TF32 matmul inputs: max |logit diff| {diffs} (prompts of {PROMPT_LENGTHS})")
        return 0
    serve_prompts = [rng.integers(0, SHAPE["vocab_size"], n).tolist() for n in SERVE_PROMPT_LENGTHS] if args.serve else None
    start = time.monotonic()
    report = {
        name: check(
            args.work, name, prompts, args.devices, args.exports.split(","), args.sampled, serve_prompts, args.serve_flags.split()
        )
        for name in args.families.split(",")
    }
    print(f"checked in {time.monotonic() - start:.0f} s")
    if args.json is not None:
        write_record(
            args.json,
            Config(args.families, args.devices, args.exports, args.sampled, args.serve, args.serve_flags),
            reference=reference_versions(),
            results=report,
        )
    bad = [
        f"{name} {label}"
        for name, by_export in report.items()
        for label, r in by_export.items()
        if r["max_abs_diff"] > MAX_ABS_DIFF_OF.get(name, MAX_ABS_DIFF)
    ]
    for name, by_export in report.items():  # WiCore's kernels against ONNX Runtime's ops, same graphs otherwise
        for label, twin in TWINS.items():
            if label not in by_export or twin not in by_export:
                continue
            mine, theirs = by_export[label]["greedy_tokens"], by_export[twin]["greedy_tokens"]
            same = sum(a == b for x, y in zip(mine, theirs) for a, b in zip(x, y))
            print(f"{name:7s} greedy tokens, {label} against {twin}: {same} / {len(mine) * GREEDY_TOKENS} equal")
            if mine != theirs:
                bad.append(f"{name} greedy tokens of {label}")
            if by_export[label]["max_abs_diff_twin"] > MAX_ABS_DIFF:
                bad.append(f"{name} {label} logits against {twin}")
    bad += [
        f"{name} {label} greedy text through wicore serve"
        for name, by_export in report.items()
        for label, r in by_export.items()
        if not all(r.get("served_greedy_equal", [True]))
    ]
    bad += [
        f"{name} {label} sampled tokens under CUDA graphs"
        for name, by_export in report.items()
        for label, r in by_export.items()
        if r.get("sampled_same_with_graphs") is False
    ]
    if bad:
        print("failed: " + ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
