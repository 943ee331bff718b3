"""Speculative decoding: single-stream decode speed with and without, WiCore and llama.cpp, one run.

    input-grounded prompts (workloads.INPUT_GROUNDED: edit / rewrite / summarize a given text)
        wicore         plain  vs  --speculative ngram (prompt lookup, K tokens)
        llama.cpp      plain  vs  LlamaPromptLookupDecoding(num_pred_tokens=K)
    ordinary prompts (workloads.ORDINARY)
        wicore         plain  vs  --draft-model (e.g. the ort-quant 270M drafting for the fp32 270M)
    batch sweep: the input-grounded prompts at 1, 2, 4, ... concurrent streams, plain vs ngram
        (aggregate tok/s: where speculation stops paying)

Every run is greedy; WiCore's texts with and without speculation are compared token for token.
Decode tok/s = (tokens - 1) / (time of the last token - time of the first), summed over the
prompts of a set (prefill excluded). llama.cpp (whose streamed chunks are not tokens) is timed as
(tokens - 1) / (seconds of the whole completion - seconds of a 1-token completion of the same prompt).

Usage:
    python tools/bench_speculative.py --model-dir models/gemma3-270m --draft-model-dir models/gemma3-270m-q \\
        --threads 2 --json docs/results/cpu-speculative-DATE.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib import gguf_path, import_llama_cpp, quiet_stderr, stream_tokens, write_record
from workloads import INPUT_GROUNDED, ORDINARY


@dataclass(frozen=True)
class Config:
    wicore_model: Path
    draft_model: Path | None
    threads: int
    max_tokens: int
    k: int
    batches: tuple[int, ...]
    json: Path | None
    skip_llama_cpp: bool


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True, help="exported target model (fp32 270M)")
    p.add_argument("--draft-model-dir", type=Path, default=None, help="exported draft model (e.g. the ort-quant 270M)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4, help="speculative tokens (wicore and llama.cpp)")
    p.add_argument("--batches", default="1,2,4,8", help="concurrent streams of the batch sweep")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--skip-llama-cpp", action="store_true")
    a = p.parse_args(argv)
    if a.k < 1 or a.max_tokens < 2:
        raise SystemExit("--k must be >= 1 and --max-tokens >= 2")
    batches = tuple(int(b) for b in a.batches.split(","))
    return Config(a.model_dir, a.draft_model_dir, a.threads, a.max_tokens, a.k, batches, a.json, a.skip_llama_cpp)


def wicore_run(cfg: Config, spec: object, prompts: list[str], concurrency: int = 1) -> dict[str, object]:
    """Decode rates of the prompts, `concurrency` streams at a time, and their token ids."""
    from wicore.runtime.engine import Engine, EngineConfig
    from wicore.runtime.sampler import SamplingParams

    config = EngineConfig(model_dir=cfg.wicore_model, num_threads=cfg.threads, verify_files=False, speculative=spec)  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=cfg.max_tokens, ignore_eos=True)
    with Engine(config).start() as engine:
        engine.generate(["Warm up the graphs."], SamplingParams(max_tokens=4, ignore_eos=True))
        ids = [engine.tokenizer.encode(p) for p in prompts]
        outputs: list[list[int]] = []
        decode_tokens, decode_seconds, wall = 0, 0.0, 0.0
        for first in range(0, len(ids), concurrency):
            group = ids[first : first + concurrency]
            start = time.perf_counter()
            request_ids = [engine.add_request(p, params) for p in group]

            async def collect(request_ids: list[str] = request_ids, start: float = start) -> list:
                return await asyncio.gather(*(stream_tokens(engine, r, start, r) for r in request_ids))

            results = asyncio.run(collect())
            wall += time.perf_counter() - start
            first_token = max(times[0] for times, _, _ in results)  # every stream past its prefill
            last_token = max(times[-1] for times, _, _ in results)
            decode_tokens += sum(sum(t > first_token for t in times) for times, _, _ in results)
            decode_seconds += last_token - first_token
            outputs += [tokens for _, tokens, _ in results]
        stats = engine.stats()
    return {
        "decode_tok_s": decode_tokens / decode_seconds if decode_seconds else 0.0,
        "num_decode_tokens": decode_tokens,
        "wall_s": wall,
        "speculative": stats["speculative"],
        "token_ids": outputs,
    }


def llama_cpp_run(cfg: Config, prompts: list[str], lookup: bool) -> dict[str, object]:
    llama_cpp = import_llama_cpp()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=cfg.k) if lookup else None
    with quiet_stderr():
        llm = llama_cpp.Llama(
            model_path=str(gguf_path()),
            n_ctx=2048,
            n_threads=cfg.threads,
            n_threads_batch=cfg.threads,
            draft_model=draft,
            verbose=False,
        )
    try:
        llm.create_completion("Warm up.", max_tokens=4, temperature=0.0)
        decode_tokens, decode_seconds = 0, 0.0
        texts = []
        for prompt in prompts:  # streamed chunks are not tokens: time a 1-token run (the prefill) and the whole run
            timed = []
            for max_tokens in (1, cfg.max_tokens):
                llm.reset()
                start = time.perf_counter()
                out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1)
                timed.append((time.perf_counter() - start, out["usage"]["completion_tokens"]))
            decode_tokens += timed[1][1] - 1
            decode_seconds += timed[1][0] - timed[0][0]
            texts.append(out["choices"][0]["text"])
    finally:
        llm.close()
    return {
        "decode_tok_s": decode_tokens / decode_seconds,
        "num_decode_tokens": decode_tokens,
        "version": llama_cpp.__version__,
        "texts": texts,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from wicore.runtime.speculative import SpeculativeConfig

    cfg = parse_args(argv)
    record: dict[str, object] = {}
    ngram = SpeculativeConfig("ngram", num_speculative_tokens=cfg.k)

    def show(label: str, plain: dict, spec: dict) -> None:
        ratio = spec["decode_tok_s"] / plain["decode_tok_s"]
        same = plain.get("token_ids") == spec.get("token_ids") if "token_ids" in plain else None
        s = spec.get("speculative") or {}
        rate = s.get("acceptance_rate")
        print(
            f"{label:<44} plain {plain['decode_tok_s']:6.1f} tok/s   speculative {spec['decode_tok_s']:6.1f} tok/s   "
            f"x{ratio:.2f}"
            + ("" if rate is None else f"   acceptance {rate:.2f}")
            + ("" if same is None else f"   same text {same}"),
            flush=True,
        )
        record[label] = {"plain": plain, "speculative": spec, "speed_up": ratio, "same_text": same}

    plain = wicore_run(cfg, None, INPUT_GROUNDED)
    show("wicore ngram, input-grounded", plain, wicore_run(cfg, ngram, INPUT_GROUNDED))
    if not cfg.skip_llama_cpp:
        show(
            "llama.cpp prompt lookup, input-grounded",
            llama_cpp_run(cfg, INPUT_GROUNDED, False),
            llama_cpp_run(cfg, INPUT_GROUNDED, True),
        )
    if cfg.draft_model is not None:
        draft = SpeculativeConfig("draft", num_speculative_tokens=cfg.k, draft_model_dir=cfg.draft_model)
        show("wicore draft model, ordinary", wicore_run(cfg, None, ORDINARY), wicore_run(cfg, draft, ORDINARY))
    for batch in cfg.batches:
        if batch > 1:
            prompts = (INPUT_GROUNDED * batch)[:batch]  # one group of `batch` streams
            show(
                f"wicore ngram, input-grounded, {batch} streams",
                wicore_run(cfg, None, prompts, batch),
                wicore_run(cfg, ngram, prompts, batch),
            )
    if cfg.json is not None:
        write_record(cfg.json, cfg, results=record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
