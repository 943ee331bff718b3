"""Many questions over one long document: what the prefix cache saves, WiCore with it and without it.

One document of --document-tokens ids (the BOS, then bench_serving's sentences shuffled), then
--questions questions, each sent alone after the previous one's answer:

    question q   | BOS  document ...................................... | question q |
                  \\__ the same ids for every question: after the first, ___/
                      its full blocks come from the prefix cache (both the
                      full layers' and the sliding layers' blocks)

Each question runs twice, in two fresh engines (prefix cache on, then off), with the same greedy
--new-tokens. Per question the tool reports the prompt tokens, the cached ones (the usage's
cached_tokens), the ones computed (engine stats) and the time to the first token as the client
sees it, with and without the cache, and whether both runs gave the same tokens.

Run from the repository root as a script (`python tools/bench_shared_document.py`); the shared
helpers come from benchlib.py and workloads.py beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchlib import CpuWatch, add_model_args, ensure_model, load_tokenizer, others_cell, run_tool, write_record
from workloads import build_prompts

QUESTIONS = (
    "Which of these sentences is about the weather?",
    "Summarise the text in one sentence.",
    "What does the text say about bees?",
    "Name two places the text mentions.",
    "Which sentence is about music?",
    "What happened in the ninetieth minute?",
    "What does the recipe need?",
    "Who kept bees and repaired clocks?",
)


@dataclass(frozen=True)
class Config:
    wicore_model: Path
    op_flavour: str
    threads: int
    num_document_tokens: int
    num_questions: int
    num_new_tokens: int
    json_path: Path | None

    def __post_init__(self) -> None:
        if not 1 <= self.num_questions <= len(QUESTIONS):
            raise ValueError(f"--questions must be in 1..{len(QUESTIONS)}")
        if min(self.threads, self.num_document_tokens, self.num_new_tokens) < 1:
            raise ValueError("--threads, --document-tokens and --new-tokens must be positive")


@dataclass(frozen=True)
class Answer:
    num_prompt_tokens: int
    num_cached_tokens: int  # the usage's cached_tokens
    num_computed_tokens: int  # prompt tokens run through the model (engine stats)
    ttft_seconds: float
    token_ids: list[int]


def ask(config: Config, prompts: list[list[int]], enable_prefix_cache: bool) -> tuple[list[Answer], float | None]:
    """Every prompt in turn through a fresh engine; the answers, and other processes' busy cores meanwhile."""
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.types.sampling import SamplingParams

    params = SamplingParams(max_tokens=config.num_new_tokens, ignore_eos=True)
    engine_config = EngineConfig(
        model_dir=config.wicore_model, num_threads=config.threads, enable_prefix_cache=enable_prefix_cache
    )
    answers = []
    with Engine(engine_config).start() as engine, CpuWatch() as watch:
        engine.generate([[2, 1000, 2000]], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up, under one block
        for prompt in prompts:
            before = engine.stats().computed_prompt_tokens
            start = time.perf_counter()
            first = None
            token_ids: list[int] = []
            for out in engine.outputs(engine.add_request(prompt, params)):
                first = first or time.perf_counter()
                token_ids += out.new_token_ids
            assert first is not None and out.finish_reason == "length", out.error
            computed = engine.stats().computed_prompt_tokens - before
            answers.append(Answer(len(prompt), out.num_cached_tokens, computed, first - start, token_ids))
    return answers, watch.num_other_busy_cores


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    parser.add_argument("--document-tokens", type=int, default=3000, help="the document's tokens, BOS included")
    parser.add_argument("--questions", type=int, default=4, help=f"questions asked in turn (at most {len(QUESTIONS)})")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens of each answer")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return Config(args.model_dir, args.op_flavour, args.threads, args.document_tokens, args.questions, args.new_tokens, args.json)


def run(config: Config, num_busy_before: float | None) -> int:
    ensure_model(config.wicore_model, config.op_flavour)
    tokenizer, manifest = load_tokenizer(config.wicore_model)
    (document,) = build_prompts(tokenizer.encode, 1, config.num_document_tokens, seed=5)
    prompts = [
        document + tokenizer.encode(f"\n\nQuestion: {q}\nAnswer:", add_bos=False) for q in QUESTIONS[: config.num_questions]
    ]
    with_cache, others_on = ask(config, prompts, True)
    without_cache, others_off = ask(config, prompts, False)
    print(f"Gemma 3 270M ({manifest.dtype} {manifest.op_flavour}), a {len(document)}-token document, {config.threads} threads\n")
    print("| question | prompt tokens | cached | computed | TTFT with cache, ms | without, ms | same tokens |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for i, (on, off) in enumerate(zip(with_cache, without_cache)):
        same = "yes" if on.token_ids == off.token_ids else "NO"
        print(
            f"| {i + 1} | {on.num_prompt_tokens} | {on.num_cached_tokens} | {on.num_computed_tokens} | "
            f"{1000 * on.ttft_seconds:.0f} | {1000 * off.ttft_seconds:.0f} | {same} |"
        )
    later_on = statistics.median(a.ttft_seconds for a in with_cache[1:]) if len(prompts) > 1 else float("nan")
    later_off = statistics.median(a.ttft_seconds for a in without_cache[1:]) if len(prompts) > 1 else float("nan")
    print(f"\nquestions after the first: median TTFT {1000 * later_on:.0f} ms with the cache, {1000 * later_off:.0f} ms without")
    print(f"other processes kept {others_cell(others_on, 1)} / {others_cell(others_off, 1)} cores busy (with / without)")
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            with_cache=[asdict(a) for a in with_cache],
            without_cache=[asdict(a) for a in without_cache],
            num_other_busy_cores={"with_cache": others_on, "without_cache": others_off},
        )
    same = all(on.token_ids == off.token_ids for on, off in zip(with_cache, without_cache))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
