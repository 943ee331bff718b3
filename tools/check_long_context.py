"""A prompt near the model's maximum: WiCore's greedy continuation against HF transformers'.

The real Gemma 3 270M continues one prompt of --prompt-tokens ids (default 30,000 of its 32,768)
by --new-tokens greedy tokens (default 64) in two engines on the same weights:

    WiCore  an exported model (fp32 portable: the exact flavour), its Engine as served: the prompt
            prefilled in chunks of the scheduler's prefill_chunk, sliding layers over their window
    HF      transformers' Gemma3ForCausalLM, fp32, SDPA attention, the weights dequantized from the
            same GGUF; the prompt prefilled in chunks of --hf-chunk tokens into its DynamicCache
            (one 30K-token pass would build 30K x 30K attention masks), then one token a step

The prompt is the BOS, then bench_serving's sentences shuffled again and again (workloads.build_prompts),
so the model cannot continue it by copying one passage. The tool prints both continuations, how many
tokens agree from the first, and each engine's seconds; it exits 1 unless all agree.

Run from the repository root as a script: `python tools/check_long_context.py --model-dir DIR`
(an fp32 portable export; exported there first if missing).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib import DEFAULT_MODEL_DIR, PACKAGED_MODEL, ensure_model, load_tokenizer, num_agreeing, run_tool, write_record
from workloads import build_prompts


@dataclass(frozen=True)
class Config:
    wicore_model: Path
    threads: int
    num_prompt_tokens: int
    num_new_tokens: int
    hf_chunk: int
    kv_pool_gb: float
    json_path: Path | None

    def __post_init__(self) -> None:
        if min(self.threads, self.num_prompt_tokens, self.num_new_tokens, self.hf_chunk) < 1:
            raise ValueError("--threads, --prompt-tokens, --new-tokens and --hf-chunk must be positive")


@dataclass(frozen=True)
class Continuation:
    engine: str
    token_ids: list[int]
    seconds: float


def wicore_greedy(config: Config, prompt_ids: list[int]) -> Continuation:
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.types.sampling import SamplingParams

    engine_config = EngineConfig(model_dir=config.wicore_model, num_threads=config.threads, kv_pool_gb=config.kv_pool_gb)
    with Engine(engine_config) as engine:
        if len(prompt_ids) + config.num_new_tokens > engine.max_sequence_tokens:
            raise SystemExit(f"error: the prompt and its tokens do not fit {engine.max_sequence_tokens}; raise --kv-pool-gb")
        start = time.perf_counter()
        (completion,) = engine.generate([prompt_ids], SamplingParams(max_tokens=config.num_new_tokens, ignore_eos=True))
        seconds = time.perf_counter() - start
    if completion.error is not None:
        raise SystemExit(f"error: WiCore failed the request: {completion.error}")
    return Continuation(f"wicore {engine.manifest.dtype} {engine.manifest.op_flavour}", completion.token_ids, seconds)


def hf_greedy(config: Config, prompt_ids: list[int]) -> Continuation:
    import torch
    from transformers import DynamicCache

    from wicore.cli.verify import load_hf_model

    torch.set_num_threads(config.threads)
    model = load_hf_model(PACKAGED_MODEL)
    model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=model.config)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompt_ids), config.hf_chunk):
            chunk = torch.tensor([prompt_ids[i : i + config.hf_chunk]])
            out = model(input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token_ids = [int(out.logits[0, -1].argmax())]
        while len(token_ids) < config.num_new_tokens:
            out = model(input_ids=torch.tensor([token_ids[-1:]]), past_key_values=cache, use_cache=True)
            token_ids.append(int(out.logits[0, -1].argmax()))
    return Continuation("hf fp32 sdpa", token_ids, time.perf_counter() - start)


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="fp32 portable export (exported if missing)")
    parser.add_argument("--threads", type=int, default=2, help="compute threads for both engines (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=30000, help="prompt length, BOS included (default 30000)")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens compared (default 64)")
    parser.add_argument("--hf-chunk", type=int, default=2048, help="HF's prefill chunk (default 2048)")
    parser.add_argument("--kv-pool-gb", type=float, default=2.0, help="WiCore's device KV pool; must hold the sequence")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return Config(args.model_dir, args.threads, args.prompt_tokens, args.new_tokens, args.hf_chunk, args.kv_pool_gb, args.json)


def run(config: Config, num_busy_before: float | None) -> int:
    ensure_model(config.wicore_model, "portable")
    tokenizer, _ = load_tokenizer(config.wicore_model)
    (prompt_ids,) = build_prompts(tokenizer.encode, 1, config.num_prompt_tokens, seed=14)
    results = []
    for label, job in (("wicore", wicore_greedy), ("hf", hf_greedy)):
        print(
            f"[{label}] {len(prompt_ids)} prompt tokens, {config.num_new_tokens} greedy tokens ...", file=sys.stderr, flush=True
        )
        results.append(job(config, prompt_ids))
    ours, reference = results
    agree = num_agreeing(ours.token_ids, reference.token_ids)
    for r in results:
        print(f"{r.engine}: {r.seconds:.1f} s; {tokenizer.decode(r.token_ids)!r}")
    print(f"{agree} of {config.num_new_tokens} greedy tokens agree after a {len(prompt_ids)}-token prompt")
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            results=[vars(r) for r in results],
            num_agreeing=agree,
        )
    return 0 if agree == config.num_new_tokens else 1


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
