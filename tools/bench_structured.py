"""Structured output: what a grammar costs, with the model's real tokenizer, and in a served batch.

    masks    the vocabulary bridge (tokenizer.json -> llguidance), a compile per schema, the mask at
             every position of a real JSON answer (as a request decodes it), and applying a mask
             to one row of float32 logits, for each --model-dir
    serving  C streams at once (--levels), all free vs half of them constrained to a JSON schema:
             aggregate tok/s = tokens generated / wall time from the first request queued to the
             last token (prefill included), same prompts, same max_tokens, one engine per run

The schema of the serving run (SERVING_SCHEMA) cannot be complete before max_tokens (an array of
at least 100 objects), so constrained and free streams generate the same number of tokens; free
streams set ignore_eos. Runs alternate (free, half, free, half ...) --repeats times and the
median of each is reported, so both see the same machine.

Usage:
    python tools/bench_structured.py masks --model-dir A --model-dir B
    python tools/bench_structured.py serving --model-dir A --levels 16,64 --new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from workloads import SERVING_SCHEMA

from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.structured.bitmask import allowed_ids, apply_bitmask
from wicore.structured.compiler import GrammarCompiler, vocabulary
from wicore.structured.spec import StructuredKind, StructuredOutput

# An OpenAI tool call's arguments (the case), and a nested extraction schema.
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_CALL_ANSWER = {"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius", "days": 3}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "tags"],
}
PERSON_ANSWER = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@analytical.org",
    "tags": ["mathematics", "poetry of science", "the first program"],
    "address": {"city": "London", "zip": "12345"},
}


def tokenizer_of(model_dir: Path) -> tuple[Tokenizer, Manifest]:
    manifest = Manifest.read(model_dir)
    assert manifest.tokenizer is not None, f"{model_dir} was exported without a tokenizer"
    return Tokenizer(model_dir, TokenizerInfo.from_dict(manifest.tokenizer)), manifest


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def masks(model_dirs: list[Path]) -> list[dict[str, object]]:
    rows = []
    for model_dir in model_dirs:
        tok, manifest = tokenizer_of(model_dir)
        vocab_size = manifest.config.vocab_size
        eos = TokenizerInfo.from_dict(manifest.tokenizer).eos_token_ids  # type: ignore[arg-type]
        started = time.perf_counter()
        compiler = GrammarCompiler(vocabulary(tok.to_json(), vocab_size, eos), vocab_size)
        bridge = time.perf_counter() - started
        for name, schema, answer in (("tool call", TOOL_CALL, TOOL_CALL_ANSWER), ("nested person", PERSON, PERSON_ANSWER)):
            spec = StructuredOutput(StructuredKind.JSON, json.dumps(schema))
            started = time.perf_counter()
            state = compiler.start(spec)
            compile_s = time.perf_counter() - started
            ids = tok.encode(json.dumps(answer), add_bos=False)
            times, sizes = [], []
            rng = np.random.default_rng(0)
            logits = rng.normal(size=vocab_size).astype(np.float32)
            apply_times = []
            for token in ids:
                started = time.perf_counter()
                mask = state.masks()[0]
                times.append(time.perf_counter() - started)
                sizes.append(len(allowed_ids(mask, vocab_size)))
                started = time.perf_counter()
                apply_bitmask(logits, mask)
                apply_times.append(time.perf_counter() - started)
                assert state.accept(token), f"the answer's token {token} is refused"
            assert state.is_accepting
            t = np.array(times)
            rows.append(
                {
                    "model": model_dir.name,
                    "vocab": vocab_size,
                    "bridge_s": bridge,
                    "schema": name,
                    "compile_ms": compile_s * 1000,
                    "tokens": len(ids),
                    "mask_ms_median": float(np.median(t) * 1000),
                    "mask_ms_mean": float(t.mean() * 1000),
                    "mask_ms_p99": float(np.percentile(t, 99) * 1000),
                    "mask_ms_max": float(t.max() * 1000),
                    "apply_ms_median": float(np.median(apply_times) * 1000),
                    "allowed_median": int(np.median(sizes)),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(
        "\n| model (vocab) | bridge | schema | compile | tokens | mask median / mean / p99 / max | apply mask | allowed (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} ({r['vocab']:,}) | {r['bridge_s']:.2f} s | {r['schema']} | {r['compile_ms']:.1f} ms | {r['tokens']} | "
            f"{r['mask_ms_median']:.3f} / {r['mask_ms_mean']:.3f} / {r['mask_ms_p99']:.3f} / {r['mask_ms_max']:.3f} ms | "
            f"{r['apply_ms_median']:.2f} ms | {r['allowed_median']} |"
        )
    return rows


def serving(model_dir: Path, levels: list[int], new_tokens: int, repeats: int, threads: int) -> None:
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.types.sampling import SamplingParams

    constrained = StructuredOutput(StructuredKind.JSON, json.dumps(SERVING_SCHEMA))
    results: dict[tuple[int, str], list[float]] = {}
    for level in levels:
        config = EngineConfig(model_dir=model_dir, num_threads=threads, scheduler=SchedulerConfig(max_num_seqs=max(levels)))
        with Engine(config).start() as engine:
            tok = engine.tokenizer
            prompts = [
                tok.encode(f"Request {i}: list the {i + 3} items below as JSON records with an id, a name and ok.")
                for i in range(level)
            ]
            engine.generate([prompts[0]], SamplingParams(max_tokens=2, structured=constrained))  # warm, and compiled once
            for _ in range(repeats):
                for mode in ("free", "half"):
                    params = [
                        SamplingParams(
                            max_tokens=new_tokens, ignore_eos=True, structured=constrained if mode == "half" and i % 2 else None
                        )
                        for i in range(level)
                    ]
                    started = time.perf_counter()
                    out = engine.generate(prompts, params)
                    wall = time.perf_counter() - started
                    assert all(len(c.token_ids) == new_tokens for c in out), [c.finish_reason for c in out]
                    results.setdefault((level, mode), []).append(sum(len(c.token_ids) for c in out) / wall)
                    m = engine.core.runner.masks.stats
                    print(
                        f"streams {level} {mode}: {results[(level, mode)][-1]:.1f} tok/s; mask thread so far: "
                        f"{m.num_steps} steps, sampling waited in {m.num_waits} ({m.wait_seconds * 1000:.1f} ms in all)",
                        flush=True,
                    )
    print("\n| streams | all free (tok/s) | half constrained (tok/s) | ratio |")
    print("|---|---|---|---|")
    for level in levels:
        free, half = statistics.median(results[(level, "free")]), statistics.median(results[(level, "half")])
        print(f"| {level} | {free:.1f} | {half:.1f} | {half / free:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("masks", "serving"))
    parser.add_argument("--model-dir", type=Path, action="append", required=True, help="an exported model folder (repeatable)")
    parser.add_argument("--levels", default="16,64", help="serving: streams at once, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.what == "masks":
        masks(args.model_dir)
    else:
        serving(args.model_dir[0], [int(x) for x in args.levels.split(",")], args.new_tokens, args.repeats, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
