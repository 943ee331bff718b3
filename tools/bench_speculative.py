"""Speculative decoding: single-stream decode speed with and without, WiCore and llama.cpp, one run.

    input-grounded prompts (workloads.INPUT_GROUNDED: edit / rewrite / summarize a given text)
        wicore         plain  vs  --speculative ngram (prompt lookup, K tokens)
        llama.cpp      plain  vs  LlamaPromptLookupDecoding(num_pred_tokens=K)
    ordinary prompts (workloads.ORDINARY)
        wicore         plain  vs  --draft-model (e.g. the ort-quant 270M drafting for the fp32 270M)
    batch sweep: each input-grounded prompt b times, in groups of b concurrent streams (b = 2, 4, 8),
        plain vs ngram (aggregate tok/s: where speculation stops paying; b = 1 is the first line)

WiCore's plain and speculative engines (and llama.cpp's two) take turns prompt by prompt, so both
see the same load on a shared machine. Every run is greedy; WiCore's texts with and without speculation are compared token for token.
Decode tok/s = (tokens - 1) / (time of the last token - time of the first), summed over the
prompts of a set (prefill excluded). llama.cpp (whose streamed chunks are not tokens) is timed as
(tokens - 1) / (seconds of the whole completion - seconds of a 1-token completion of the same prompt),
plain and lookup in lockstep, each completion the faster of two.

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

from benchlib import gguf_path, import_llama_cpp, num_busy_cores, quiet_stderr, stream_tokens, write_record
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


def wicore_runs(cfg: Config, specs: Sequence[object], prompts: list[str], concurrency: int = 1) -> list[dict[str, object]]:
    """One engine per speculative setting (None: plain), taking turns group by group (`concurrency`
    prompts at a time), so that every setting sees the same load: decode rates and token ids."""
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.types.sampling import SamplingParams

    params = SamplingParams(max_tokens=cfg.max_tokens, ignore_eos=True)
    engines = []
    try:
        for spec in specs:
            config = EngineConfig(model_dir=cfg.wicore_model, num_threads=cfg.threads, verify_files=False, speculative=spec)  # type: ignore[arg-type]
            engines.append(Engine(config).start())
            engines[-1].generate(["Warm up the graphs."], SamplingParams(max_tokens=4, ignore_eos=True))
        ids = [engines[0].tokenizer.encode(p) for p in prompts]
        totals = [[0, 0.0, []] for _ in engines]  # decode tokens, decode seconds, token ids
        for first in range(0, len(ids), concurrency):
            for engine, total in zip(engines, totals):
                start = time.perf_counter()
                request_ids = [engine.add_request(p, params) for p in ids[first : first + concurrency]]

                async def collect(engine=engine, request_ids: list[str] = request_ids, start: float = start) -> list:
                    return await asyncio.gather(*(stream_tokens(engine, r, start, r) for r in request_ids))

                results = asyncio.run(collect())
                first_token = max(times[0] for times, _, _ in results)  # every stream past its prefill
                last_token = max(times[-1] for times, _, _ in results)
                total[0] += sum(sum(t > first_token for t in times) for times, _, _ in results)
                total[1] += last_token - first_token
                total[2] += [tokens for _, tokens, _ in results]
        stats = [engine.stats().to_dict()["speculative"] for engine in engines]  # JSON for the record
    finally:
        for engine in engines:
            engine.stop()
    return [
        {"decode_tok_s": n / seconds if seconds else 0.0, "num_decode_tokens": n, "speculative": st, "token_ids": outputs}
        for (n, seconds, outputs), st in zip(totals, stats)
    ]


def llama_cpp_runs(cfg: Config, prompts: list[str]) -> tuple[dict[str, object], dict[str, object]]:
    """llama.cpp plain and with LlamaPromptLookupDecoding(num_pred_tokens=K), in lockstep prompt by
    prompt (both see the same load), each completion timed twice and the faster kept: llama.cpp's
    spinning thread pool slows down many times over when other processes take the cores."""
    llama_cpp = import_llama_cpp()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    engines = []
    with quiet_stderr():
        for lookup in (False, True):
            draft = LlamaPromptLookupDecoding(num_pred_tokens=cfg.k) if lookup else None
            engines.append(
                llama_cpp.Llama(
                    model_path=str(gguf_path()),
                    n_ctx=1024,
                    n_threads=cfg.threads,
                    n_threads_batch=cfg.threads,
                    draft_model=draft,
                    verbose=False,
                )
            )
    totals = [[0, 0.0, []] for _ in engines]  # decode tokens, decode seconds, texts
    try:
        for llm in engines:
            llm.create_completion("Warm up.", max_tokens=4, temperature=0.0)
        for prompt in prompts:  # streamed chunks are not tokens: time a 1-token completion (the prefill) and the whole one
            for llm, total in zip(engines, totals):
                best = []
                for max_tokens in (1, cfg.max_tokens):
                    runs = []
                    for _ in range(2):
                        llm.reset()
                        start = time.perf_counter()
                        out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1)
                        runs.append((time.perf_counter() - start, out["usage"]["completion_tokens"], out["choices"][0]["text"]))
                    best.append(min(runs))
                total[0] += best[1][1] - 1
                total[1] += best[1][0] - best[0][0]
                total[2].append(best[1][2])
    finally:
        for llm in engines:
            llm.close()
    return tuple(  # type: ignore[return-value]
        {"decode_tok_s": n / seconds, "num_decode_tokens": n, "version": llama_cpp.__version__, "texts": texts}
        for n, seconds, texts in totals
    )


def main(argv: Sequence[str] | None = None) -> int:
    from wicore.engine.speculative import SpeculativeConfig

    cfg = parse_args(argv)
    record: dict[str, object] = {}
    ngram = SpeculativeConfig("ngram", num_speculative_tokens=cfg.k)

    def show(label: str, plain: dict, spec: dict) -> None:
        others = num_busy_cores()  # measured between runs: other processes' load
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
        record[label] = {"plain": plain, "speculative": spec, "speed_up": ratio, "same_text": same, "busy_cores_after": others}

    show("wicore ngram, input-grounded", *wicore_runs(cfg, [None, ngram], INPUT_GROUNDED))
    if not cfg.skip_llama_cpp:
        show("llama.cpp prompt lookup, input-grounded", *llama_cpp_runs(cfg, INPUT_GROUNDED))
    if cfg.draft_model is not None:
        draft = SpeculativeConfig("draft", num_speculative_tokens=cfg.k, draft_model_dir=cfg.draft_model)
        show("wicore draft model, ordinary", *wicore_runs(cfg, [None, draft], ORDINARY))
    for batch in cfg.batches:  # every prompt `batch` times, in groups of `batch` streams
        if batch > 1:
            prompts = [p for p in INPUT_GROUNDED for _ in range(batch)]
            show(f"wicore ngram, input-grounded, {batch} streams", *wicore_runs(cfg, [None, ngram], prompts, batch))
    if cfg.json is not None:
        write_record(cfg.json, cfg, results=record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
