"""KV blocks in 8 bits (`wicore-export --kv-cache-dtype int8`, graph/kv_quant.py) against float32 KV
on the real Gemma 3 270M, on the CPU: the same fp32 graphs, only the pools differ.

    greedy     --new-tokens greedy tokens of five prompts: the first token where the two differ
    logits     the prompt logits of one --long-tokens prompt (bench_serving's sentences, prefilled
               in chunks of 256 so later chunks read the int8 K/V the earlier ones wrote):
               argmax agreement and max |logit difference|
    memory     KV bytes a token (every layer, K and V) and device blocks a 1 GiB pool holds
    speed      decode tok/s of the five prompts together, each engine's

Run from the repository root: `python tools/check_kv_int8.py --work /tmp/kv8 --json out.json`
(the two exports are made there first if missing).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import PACKAGED_MODEL, load_tokenizer, num_agreeing, run_tool, write_record
from workloads import build_prompts

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import MANIFEST, Manifest
from wicore.kv.layout import KVLayout
from wicore.types.sampling import SamplingParams

PROMPTS = (
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize foods "
    "from carbon dioxide and water. In plants, it generally involves the green pigment chlorophyll and",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "The three laws of thermodynamics are",
)
KV_DTYPES = ("auto", "int8")  # auto: the fp32 export's float32 KV


@dataclass(frozen=True)
class Config:
    work: Path
    threads: int
    num_new_tokens: int
    num_long_tokens: int
    json_path: Path | None


def export(work: Path, kv_cache_dtype: str) -> Path:
    out = work / f"gemma3-270m-kv-{kv_cache_dtype}"
    if not (out / MANIFEST).is_file():
        export_model(
            open_source(PACKAGED_MODEL), out, ExportConfig(kv_cache_dtype=kv_cache_dtype, overwrite=True), progress=lambda _: None
        )
    return out


def measure(model_dir: Path, config: Config, long_prompt: list[int]) -> dict[str, object]:
    engine_config = EngineConfig(model_dir=model_dir, num_threads=config.threads, num_host_blocks=0, num_nvme_blocks=0)
    with Engine(engine_config) as engine:
        start = time.perf_counter()
        done = engine.generate(list(PROMPTS), SamplingParams(max_tokens=config.num_new_tokens, ignore_eos=True))
        seconds = time.perf_counter() - start
        (long,) = engine.generate([long_prompt], SamplingParams(max_tokens=1, prompt_logits=True))
    manifest = Manifest.read(model_dir)
    layout = KVLayout.of(manifest, 16)
    per_token = (len(layout.full_layers) + len(layout.window_layers)) * layout.layer_block_bytes // 16
    return {
        "tokens": [c.token_ids for c in done],
        "tokens_per_s": len(PROMPTS) * config.num_new_tokens / seconds,
        "prompt_logits": long.prompt_logits,
        "kv_dtype": manifest.kv_dtype,
        "kv_bytes_per_token": per_token,
    }


def run(config: Config, busy_before: float | None = None) -> int:
    config.work.mkdir(parents=True, exist_ok=True)
    folders = {kv: export(config.work, kv) for kv in KV_DTYPES}
    tokenizer, _ = load_tokenizer(folders["auto"])
    long_prompt = build_prompts(tokenizer.encode, 1, config.num_long_tokens, seed=3)[0]
    results = {kv: measure(folder, config, long_prompt) for kv, folder in folders.items()}
    ref, q = results["auto"], results["int8"]
    first_diff = [num_agreeing(a, b) for a, b in zip(q["tokens"], ref["tokens"])]  # type: ignore[arg-type]
    ref_logits, q_logits = ref.pop("prompt_logits"), q.pop("prompt_logits")
    agreement = float(np.mean(q_logits.argmax(-1) == ref_logits.argmax(-1)))  # type: ignore[union-attr]
    max_diff = float(np.abs(q_logits - ref_logits).max())  # type: ignore[operator]
    print(f"greedy, {config.num_new_tokens} tokens: the same up to token {first_diff} (of each prompt)")
    print(f"{config.num_long_tokens}-token prompt logits: argmax agreement {agreement:.4f}, max |diff| {max_diff:.3f}")
    for r in results.values():
        print(f"{r['kv_dtype']:>8} KV: {r['kv_bytes_per_token']:,} bytes a token, decode {r['tokens_per_s']:.1f} tok/s")
    if config.json_path is not None:
        fields = {"first_difference": first_diff, "argmax_agreement": agreement, "max_abs_logit_diff": max_diff}
        write_record(config.json_path, config, **fields, num_busy_cores_before=busy_before, results=results)
    return 0


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-kv8"), help="the two exports (made once, reused)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--long-tokens", type=int, default=1024)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    return Config(a.work, a.threads, a.new_tokens, a.long_tokens, a.json)


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
