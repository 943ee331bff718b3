"""Serving throughput under concurrency: WiCore's engine against llama.cpp on the same requests, in one run.

At each concurrency level C, C requests arrive at once: each has exactly --prompt-tokens
prompt ids (BOS, a distinct header, then the same sentences in a different order, so no
two prompts share a first KV block and the prefix cache has nothing to reuse) and asks
for --new-tokens greedy tokens with ignore_eos. Every engine gets the same prompt ids and
the same total thread count; the client stamps each token with the time it receives it.

    request r:  arrival a_r     first token f_r = t_r,1      t_r,2     ...      t_r,M
                |---- TTFT ---->|--------- ITL ---------|-- ITL --| ... |
    level:             min_r f_r |<------------------- window ------------------>| max_r t_r,M

    aggregate decode tok/s = sum over r of (M - 1)  /  (max_r t_r,M - min_r f_r)
    TTFT_r = f_r - a_r (queueing included)       ITL = t_r,k+1 - t_r,k, pooled over all r and k
    p50 / p99: linear interpolation between order statistics (numpy's default)

Each request's first token comes from its prefill and is left out of the numerator; prefills
of later requests that fall inside the window count against it, as they would for a server.
"vs 1-stream" divides by WiCore's aggregate at C = 1, which is its own single-stream decode rate.
One stream is the shortest and noisiest measurement, and the denominator of every ratio: it is
measured --single-repeats times (default 5) for every engine, and the median is reported.

Who serves the requests (tools/serving_engines.py): wicore, the Engine with continuous batching,
a fresh engine per level; llama.cpp sequential (a), one context, FCFS; llama.cpp contexts xN (b),
N contexts in N threads; llama.cpp batched, one context holding C sequences as llama-server does.

The issue's target: at 16 streams WiCore's aggregate is >= 4x its single-stream rate and
>= 2x llama.cpp's best aggregate over modes (a) and (b). llama.cpp batched is outside that
definition and is reported beside it.

Levels run in order, and within a level every engine and mode back to back, so the rows of one
level see the same machine. Before each measurement the tool waits (--max-wait) for other
processes to leave the cores; during it, it watches /proc/stat, and when they kept more than
MAX_OTHER_CORES cores busy it measures again (--retries) and keeps the calmest attempt; the table
says how busy the others were. What /proc/stat cannot show (other tenants of a shared host taking
memory bandwidth) still moves the rates: compare rows of one level, and repeat a run.

Run from the repository root as a script (`python tools/bench_serving.py`): the shared helpers
come from the sibling modules benchlib.py, workloads.py and serving_engines.py, then on sys.path.
When --model-dir holds no exported model, Gemma 3 270M is exported there first (--op-flavour).

Usage:
    python tools/bench_serving.py --model-dir models/gemma3-270m --json serving.json
    python tools/bench_serving.py --levels 1,4 --new-tokens 16 --llama-modes sequential
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchlib import (
    EngineUnavailable,
    add_measure_args,
    add_model_args,
    ensure_model,
    gguf_path,
    int_list,
    load_tokenizer,
    measure_calmest,
    num_agreeing,
    others_cell,
    percentile,
    run_tool,
    write_record,
)
from serving_engines import (
    LLAMA_MODES,
    LlamaBatched,
    LlamaContexts,
    Served,
    Trace,
    WiCoreServer,
    llama_servers,
)
from workloads import build_prompts

from wicore.engine.scheduler import SchedulerConfig

TARGET_STREAMS = 16
TARGET_VS_SINGLE = 4.0
TARGET_VS_LLAMA = 2.0


@dataclass(frozen=True)
class LevelResult:
    engine: str
    mode: str
    num_streams: int
    threads: int
    aggregate_decode_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    wall_seconds: float  # level start to the last token
    num_generated_tokens: int
    num_other_busy_cores: float | None
    num_attempts: int
    prefix_hit_rate: float | None
    num_agreeing_tokens: int  # of request 0's greedy tokens, a common prefix with WiCore's at 1 stream
    traces: tuple[Trace, ...]
    repeat_rates: tuple[float, ...] = ()  # the aggregate of every repeat (one stream: the median is reported)


@dataclass(frozen=True)
class BenchConfig:
    levels: tuple[int, ...]
    threads: int
    num_prompt_tokens: int
    num_new_tokens: int
    wicore_model: Path
    op_flavour: str
    llama_modes: tuple[str, ...]
    llama_contexts: tuple[int, ...]
    is_prefix_cache: bool
    budget: dict[str, int]  # WiCore's SchedulerConfig token budgets, where not its defaults
    num_retries: int
    max_wait_s: float
    num_single_repeats: int
    seed: int
    json_path: Path | None

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ValueError("--levels must be positive integers, e.g. 1,4,16,64")
        if self.threads < 1:
            raise ValueError("--threads must be at least 1")
        if self.num_prompt_tokens < 16:
            raise ValueError("--prompt-tokens must be at least 16 (BOS and a distinct header come first)")
        if self.num_new_tokens < 2:
            raise ValueError("--new-tokens must be at least 2 (the first token comes from prefill)")
        unknown = set(self.llama_modes) - set(LLAMA_MODES)
        if unknown:
            raise ValueError(f"unknown llama.cpp mode(s) {sorted(unknown)}; choose from {', '.join(LLAMA_MODES)}")
        if any(not 2 <= n <= self.threads for n in self.llama_contexts):
            raise ValueError(f"--llama-contexts: each count must be in 2..--threads ({self.threads})")
        if self.num_retries < 0 or self.num_single_repeats < 1:
            raise ValueError("--retries must be >= 0 and --single-repeats at least 1")


# --------------------------------------------------------------------------- statistics


def summarize(engine: str, mode: str, threads: int, served: Served, num_attempts: int, reference: Sequence[int]) -> LevelResult:
    """The level's numbers from its traces (definitions in the module docstring)."""
    traces = served.traces
    first = min(t.token_times[0] for t in traces)
    last = max(t.token_times[-1] for t in traces)
    num_decoded = sum(len(t.token_times) - 1 for t in traces)
    ttfts = [t.token_times[0] - t.arrival for t in traces]
    itls = [b - a for t in traces for a, b in zip(t.token_times, t.token_times[1:])]
    return LevelResult(
        engine=engine,
        mode=mode,
        num_streams=len(traces),
        threads=threads,
        aggregate_decode_tokens_per_s=num_decoded / (last - first) if last > first else math.nan,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        itl_p50_s=percentile(itls, 50),
        itl_p99_s=percentile(itls, 99),
        wall_seconds=last,
        num_generated_tokens=sum(len(t.token_times) for t in traces),
        num_other_busy_cores=served.num_other_busy_cores,
        num_attempts=num_attempts,
        prefix_hit_rate=served.prefix_hit_rate,
        num_agreeing_tokens=num_agreeing(traces[0].token_ids, reference),
        traces=traces,
    )


# --------------------------------------------------------------------------- run


def run_levels(config: BenchConfig) -> tuple[list[LevelResult], dict[str, str], dict[str, str]]:
    """Level by level, every engine and mode back to back, so that the rows of one level see the same
    machine (on a shared host its speed drifts by tens of percent over minutes, with no process to show
    for it). Returns results, skipped engines, versions."""
    import wicore

    levels = sorted(set(config.levels) | {1})  # 1 stream is the reference rate
    model_dir = ensure_model(config.wicore_model, config.op_flavour)
    tokenizer, _ = load_tokenizer(model_dir)
    prompts = build_prompts(tokenizer.encode, max(levels), config.num_prompt_tokens, config.seed)
    versions = {"wicore": f"wicore {wicore.__version__}"}
    skipped: dict[str, str] = {}
    servers: list[tuple[str, str, WiCoreServer | LlamaContexts | LlamaBatched]] = [
        (
            "wicore",
            "continuous batching",
            WiCoreServer(model_dir, tokenizer, config.threads, config.is_prefix_cache, config.budget),
        )
    ]
    num_ctx = config.num_prompt_tokens + config.num_new_tokens + 16
    gguf = gguf_path() if config.llama_modes else Path()
    for name, make_server in llama_servers(config.llama_modes, config.llama_contexts, config.threads, num_ctx, gguf):
        try:
            server = make_server()
        except EngineUnavailable as exc:
            skipped[f"llama.cpp {name}"] = str(exc)
            print(f"[llama.cpp {name}] skipped: {exc}", file=sys.stderr, flush=True)
            continue
        versions["llama.cpp"] = f"llama-cpp-python {server.llama_cpp.__version__}"
        servers.append(("llama.cpp", name, server))

    results: list[LevelResult] = []
    reference: tuple[int, ...] = ()  # WiCore's greedy tokens for request 0 at one stream
    try:
        for level in levels:
            for engine, mode, server in servers:
                serve = functools.partial(server.serve, prompts[:level], config.num_new_tokens)
                results.append(measure_level(engine, mode, level, serve, config, reference))
                reference = reference or results[-1].traces[0].token_ids
                gc.collect()
    finally:
        for _, _, server in servers:
            server.close()
    return results, skipped, versions


def measure_level(
    engine: str, mode: str, level: int, serve: Callable[[], Served], config: BenchConfig, reference: Sequence[int]
) -> LevelResult:
    """One level, measured once; at one stream (the reference rate, and the shortest, noisiest
    measurement) `config.num_single_repeats` times, keeping the median by aggregate rate."""
    label = f"{engine} {mode}, {level} streams"
    print(f"[{label}] ...", file=sys.stderr, flush=True)
    repeats = []
    for _ in range(config.num_single_repeats if level == 1 else 1):
        served, attempts = measure_calmest(label, serve, config.num_retries, config.max_wait_s)
        repeats.append(summarize(engine, mode, config.threads, served, attempts, reference or served.traces[0].token_ids))
    rates = tuple(r.aggregate_decode_tokens_per_s for r in repeats)
    median = sorted(repeats, key=lambda r: r.aggregate_decode_tokens_per_s)[len(repeats) // 2]
    return replace(median, repeat_rates=rates)


# --------------------------------------------------------------------------- report


def single_stream_rate(results: list[LevelResult]) -> float:
    return next(r.aggregate_decode_tokens_per_s for r in results if r.engine == "wicore" and r.num_streams == 1)


def markdown_table(results: list[LevelResult]) -> str:
    single = single_stream_rate(results)
    lines = [
        (
            "| streams | engine | mode | aggregate decode tok/s | vs WiCore 1-stream | TTFT p50 ms | TTFT p99 ms "
            "| ITL p50 ms | ITL p99 ms | wall s | others' cores |"
        ),
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: r.num_streams):
        others = others_cell(r.num_other_busy_cores, r.num_attempts)
        lines.append(
            f"| {r.num_streams} | {r.engine} | {r.mode} | {r.aggregate_decode_tokens_per_s:.1f} "
            f"| {r.aggregate_decode_tokens_per_s / single:.2f}x | {1000 * r.ttft_p50_s:.0f} | {1000 * r.ttft_p99_s:.0f} "
            f"| {1000 * r.itl_p50_s:.1f} | {1000 * r.itl_p99_s:.1f} | {r.wall_seconds:.1f} | {others} |"
        )
    return "\n".join(lines)


def target_report(results: list[LevelResult]) -> tuple[str, bool | None]:
    """The issue's target at TARGET_STREAMS streams, in words, and whether it holds (None: not measured)."""
    single = single_stream_rate(results)
    at = [r for r in results if r.num_streams == TARGET_STREAMS]
    wicore = next((r for r in at if r.engine == "wicore"), None)
    peers = [r for r in at if r.engine == "llama.cpp" and r.mode != "batched"]
    if wicore is None or not peers:
        return f"target: not evaluated (needs WiCore and llama.cpp sequential/contexts at {TARGET_STREAMS} streams)", None
    best = max(peers, key=lambda r: r.aggregate_decode_tokens_per_s)
    vs_single = wicore.aggregate_decode_tokens_per_s / single
    vs_llama = wicore.aggregate_decode_tokens_per_s / best.aggregate_decode_tokens_per_s
    holds = vs_single >= TARGET_VS_SINGLE and vs_llama >= TARGET_VS_LLAMA
    lines = [
        (
            f"target at {TARGET_STREAMS} streams: WiCore {wicore.aggregate_decode_tokens_per_s:.1f} tok/s = "
            f"{vs_single:.2f}x its single stream ({single:.1f} tok/s; needs >= {TARGET_VS_SINGLE:g}x: "
            f"{'yes' if vs_single >= TARGET_VS_SINGLE else 'no'}) and {vs_llama:.2f}x llama.cpp's best of "
            f"sequential / N contexts ({best.mode}, {best.aggregate_decode_tokens_per_s:.1f} tok/s; needs >= "
            f"{TARGET_VS_LLAMA:g}x: {'yes' if vs_llama >= TARGET_VS_LLAMA else 'no'}): "
            f"{'HOLDS' if holds else 'DOES NOT HOLD'}"
        )
    ]
    batched = next((r for r in at if r.engine == "llama.cpp" and r.mode == "batched"), None)
    if batched is not None:
        lines.append(
            f"outside the target: llama.cpp batched ({TARGET_STREAMS} sequences in one context) reaches "
            f"{batched.aggregate_decode_tokens_per_s:.1f} tok/s; WiCore is "
            f"{wicore.aggregate_decode_tokens_per_s / batched.aggregate_decode_tokens_per_s:.2f}x of it"
        )
    return "\n".join(lines), holds


def write_json(
    path: Path,
    config: BenchConfig,
    results: list[LevelResult],
    skipped: dict[str, str],
    versions: dict[str, str],
    target: tuple[str, bool | None],
    num_busy_before: float | None,
) -> None:
    def rounded(r: LevelResult) -> dict[str, object]:
        record = asdict(r)
        record["traces"] = [
            {"arrival": round(t.arrival, 6), "token_times": [round(x, 6) for x in t.token_times], "token_ids": list(t.token_ids)}
            for t in r.traces
        ]
        return record

    write_record(
        path,
        config,
        num_busy_cores_before=num_busy_before,
        versions=versions,
        target={"text": target[0], "holds": target[1]},
        results=[rounded(r) for r in results],
        skipped=skipped,
    )


# --------------------------------------------------------------------------- cli


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4,16,64", help="concurrency levels (1 is always measured)")
    parser.add_argument("--threads", type=int, default=2, help="compute threads, in total, for every engine (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length of every request, BOS included")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    add_model_args(parser)
    parser.add_argument("--llama-modes", default=",".join(LLAMA_MODES), help="from: " + ", ".join(LLAMA_MODES))
    parser.add_argument("--llama-contexts", help="context counts for the contexts mode (default: --threads, if >= 2)")
    parser.add_argument("--no-prefix-cache", action="store_true", help="run WiCore with its prefix cache off")
    parser.add_argument("--max-batched-tokens", type=int, help="WiCore's token budget per step (default: the scheduler's)")
    parser.add_argument("--prefill-with-decodes", type=int, help="WiCore's prefill tokens per step while requests decode")
    add_measure_args(parser)
    parser.add_argument("--single-repeats", type=int, default=5, help="measurements at one stream; the median is kept")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the prompts' sentences")
    parser.add_argument("--json", type=Path, help="also write a JSON record (with every token's time) here")
    args = parser.parse_args(argv)
    contexts = int_list(args.llama_contexts) if args.llama_contexts else ((args.threads,) if args.threads >= 2 else ())
    modes = tuple(m.strip() for m in args.llama_modes.split(",") if m.strip())
    return BenchConfig(
        levels=int_list(args.levels),
        threads=args.threads,
        num_prompt_tokens=args.prompt_tokens,
        num_new_tokens=args.new_tokens,
        wicore_model=args.model_dir,
        op_flavour=args.op_flavour,
        llama_modes=tuple(m for m in modes if m != "contexts" or contexts),
        llama_contexts=contexts,
        is_prefix_cache=not args.no_prefix_cache,
        budget={
            k: v
            for k, v in (("max_num_batched_tokens", args.max_batched_tokens), ("prefill_with_decodes", args.prefill_with_decodes))
            if v is not None
        },
        num_retries=args.retries,
        max_wait_s=args.max_wait,
        num_single_repeats=args.single_repeats,
        seed=args.seed,
        json_path=args.json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(argv, parse_args, run)


def run(config: BenchConfig, num_busy_before: float | None) -> int:
    """Every level, then the table, the target (and the record)."""
    try:
        results, skipped, versions = run_levels(config)
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    target = target_report(results)
    sched = replace(SchedulerConfig(), **config.budget)
    print(
        f"Gemma 3 270M serving, {config.threads} threads, {config.num_prompt_tokens} prompt tokens, "
        f"{config.num_new_tokens} new tokens per request, greedy, ignore_eos, "
        f"WiCore prefix cache {'on' if config.is_prefix_cache else 'off'}, "
        f"WiCore {sched.max_num_batched_tokens} tokens a step ({sched.prefill_with_decodes} of prefill while "
        f"decoding); 1-stream rows: median of "
        f"{config.num_single_repeats}\n"
    )
    print(markdown_table(results))
    print()
    print(target[0])
    for name, reason in skipped.items():
        print(f"\n{name} skipped: {reason}")
    if config.json_path is not None:
        write_json(config.json_path, config, results, skipped, versions, target, num_busy_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
