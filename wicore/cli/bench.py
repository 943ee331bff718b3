"""`wicore bench throughput` and `wicore bench serve`: the two benchmarks vLLM users know.

throughput: requests through the engine's public API (Engine.generate), all queued at once, as
    `vllm bench throughput`: requests/s and output tokens/s over the whole run.
serve: an HTTP load against any OpenAI-compatible endpoint (wicore.cli.load), one level per
    concurrency, as `vllm bench serve`: TTFT, time per output token and inter-token latency.

Prompts are random token ids; every request generates exactly `--output-len` tokens (ignore_eos).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from wicore.cli.engine_args import add_engine_args, engine_config
from wicore.cli.load import LevelResult, LoadConfig, Spread, check_endpoint, model_name, random_prompts, run_level_in_processes
from wicore.errors import UsageError

if TYPE_CHECKING:
    from wicore.engine.trace import PhaseSeconds


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the engine (throughput) or an OpenAI endpoint (serve)")
    kinds = p.add_subparsers(dest="bench", required=True)
    t = kinds.add_parser("throughput", help="requests through the engine: requests/s and output tokens/s")
    t.add_argument("--model", required=True, help="exported model folder, or gemma3-270m / smollm2-135m-instruct")
    _add_load_args(t)
    t.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    add_engine_args(t)
    t.set_defaults(func=run_throughput)
    s = kinds.add_parser("serve", help="an HTTP load on an OpenAI endpoint: TTFT, TPOT, ITL per concurrency")
    s.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    s.add_argument("--concurrency", default="1,16,64", help="requests in flight at once, one level each")
    s.add_argument("--served-model-name", default=None, help="the model id to send (default: the first /v1/models lists)")
    s.add_argument("--api-key", default=None, help="Bearer key (default: $OPENAI_API_KEY)")
    s.add_argument("--vocab-size", type=int, default=32000, help="prompt token ids are drawn below this")
    s.add_argument("--min-token-id", type=int, default=0, help="... and from this up (past special tokens)")
    s.add_argument(
        "--processes", type=int, default=1, help="client processes sharing each level's load (one tops out near a core)"
    )
    _add_load_args(s)
    s.set_defaults(func=run_serve_bench)


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-prompts", type=int, default=64, help="requests (in bench serve: per concurrency level)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens a request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens a request")
    p.add_argument(
        "--seed", type=int, default=0, help="of the random prompts (bench serve: level i of --concurrency draws from seed + i)"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results to this file")


@dataclass(frozen=True)
class ThroughputResult:
    num_requests: int
    num_failed: int
    num_prompt_tokens: int
    num_output_tokens: int
    elapsed: float  # seconds, the first request queued to the last one's end
    num_steps: int = 0  # engine steps that ran rows
    step_ms: dict[str, float] | None = None  # a step's mean milliseconds by phase (step_breakdown)

    @property
    def requests_per_second(self) -> float:
        return self.num_requests / self.elapsed

    @property
    def output_tokens_per_second(self) -> float:
        return self.num_output_tokens / self.elapsed

    @property
    def total_tokens_per_second(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed


def measure_throughput(engine, prompts: list[list[int]], params) -> ThroughputResult:  # engine: Engine, params: SamplingParams
    """Queue every prompt at once and run them to their ends through Engine.generate."""
    steps, seconds = engine.num_steps, engine.core.seconds
    start = time.perf_counter()
    completions = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    num_steps = engine.num_steps - steps
    return ThroughputResult(
        num_requests=len(prompts),
        num_failed=sum(c.finish_reason == "error" for c in completions),
        num_prompt_tokens=sum(map(len, prompts)),
        num_output_tokens=sum(len(c.token_ids) for c in completions),
        elapsed=elapsed,
        num_steps=num_steps,
        step_ms=step_breakdown(engine.core.seconds, seconds, elapsed, num_steps),
    )


def step_breakdown(after: PhaseSeconds, before: PhaseSeconds, elapsed: float, num_steps: int) -> dict[str, float] | None:
    """A step's mean milliseconds: the wall time over the steps, each phase of EngineCore.step (the
    graphs' runs apart from the host's part of `run`), and the rest (`loop`: the engine thread's
    handing out of outputs and taking in of requests, and steps that ran no rows)."""
    if num_steps == 0:
        return None
    s = type(after)(*(a - b for a, b in zip(astuple(after), astuple(before))))
    ms = {
        "step": elapsed,
        "schedule": s.schedule_s,
        "moves": s.moves_s,
        "graphs": s.graphs_s,
        "run_host": s.run_s - s.graphs_s,
        "update": s.update_s,
        "loop": elapsed - s.total_s,
    }
    return {name: 1000 * seconds / num_steps for name, seconds in ms.items()}


def format_breakdown(ms: dict[str, float]) -> str:
    """The step line. With steps in flight (async scheduling) the device's graphs overlap the host's
    phases: the engine thread's `run` is then its wait for the worker, shorter than the graphs (the
    `run_host` phase negative by what the overlap hid), so the line says so rather than subtract."""
    if ms["run_host"] < 0:
        wait = ms["graphs"] + ms["run_host"]
        return (
            f"A step: {ms['step']:.2f} ms, the graphs {ms['graphs']:.2f} of it overlapped with the host's work "
            f"(steps in flight: schedule {ms['schedule']:.2f}, KV moves {ms['moves']:.2f}, update {ms['update']:.2f}, "
            f"engine loop {ms['loop']:.2f}; the engine thread waited {wait:.2f} for the device)"
        )
    host = ms["step"] - ms["graphs"]
    return (
        f"A step: {ms['step']:.2f} ms, of which graphs {ms['graphs']:.2f} and host {host:.2f} "
        f"(schedule {ms['schedule']:.2f}, KV moves {ms['moves']:.2f}, run outside the graphs {ms['run_host']:.2f}, "
        f"update {ms['update']:.2f}, engine loop {ms['loop']:.2f})"
    )


def run_throughput(args: argparse.Namespace) -> int:
    from wicore.cli.models import resolve_model
    from wicore.devices.providers import onnxruntime
    from wicore.engine.engine import Engine
    from wicore.types.sampling import SamplingParams

    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    onnxruntime()  # fail early, with the extras to install, before any export
    args.max_num_seqs = min(args.max_num_seqs, args.num_prompts)  # the sliding layers' pool is sized for these
    params = SamplingParams(max_tokens=args.output_len, temperature=args.temperature, ignore_eos=True, seed=args.seed)
    with Engine(engine_config(args, resolve_model(args.model, args.devices))) as engine:
        vocab = engine.manifest.config.vocab_size
        prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
        result = measure_throughput(engine, prompts, params)
    print(
        f"Throughput: {result.requests_per_second:.2f} requests/s, {result.total_tokens_per_second:.2f} total tokens/s, "
        f"{result.output_tokens_per_second:.2f} output tokens/s ({result.num_requests} requests of "
        f"{args.input_len} + {args.output_len} tokens in {result.elapsed:.2f} s)"
    )
    if result.step_ms is not None:
        print(f"{format_breakdown(result.step_ms)}; {result.num_steps} steps")
    rates = {
        "requests_per_second": result.requests_per_second,
        "output_tokens_per_second": result.output_tokens_per_second,
        "total_tokens_per_second": result.total_tokens_per_second,
    }
    _write_json(args.json, {"command": "throughput", **vars_of(args), **asdict(result), **rates})
    if result.num_failed:
        print(f"wicore: error: {result.num_failed} of {result.num_requests} requests failed", file=sys.stderr)
        return 1
    return 0


def run_serve_bench(args: argparse.Namespace) -> int:

    try:
        levels = [int(c) for c in str(args.concurrency).split(",")]
    except ValueError as exc:
        raise UsageError(f"--concurrency {args.concurrency!r}: give numbers separated by commas, e.g. 1,16,64") from exc
    if not levels or min(levels) < 1:
        raise UsageError(f"--concurrency {args.concurrency!r}: every level must be at least 1")
    if args.processes < 1:
        raise UsageError(f"--processes must be at least 1, got {args.processes}")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    name = args.served_model_name or model_name(args.base_url, api_key)
    config = LoadConfig(
        args.base_url,
        name,
        args.num_prompts,
        args.input_len,
        args.output_len,
        vocab_size=args.vocab_size,
        min_token_id=args.min_token_id,
        api_key=api_key,
        seed=args.seed,
    )
    check_endpoint(config)
    results = []
    for level, level_config in level_configs(config, levels):
        result = run_level_in_processes(level_config, level, args.processes)
        results.append(result)
        print(format_level(result), flush=True)
    _write_json(args.json, {"command": "serve", **vars_of(args), "levels": [level_record(r) for r in results]})
    failed = sum(r.num_failed for r in results)
    if failed:
        first = next(r.first_error for r in results if r.first_error)
        print(f"wicore: error: {failed} requests failed; the first: {first}", file=sys.stderr)
        return 1
    return 0


def level_configs(config: LoadConfig, levels: list[int]) -> list[tuple[int, LoadConfig]]:
    """Each concurrency level with its load: level i draws its prompts from seed + i, so that no level
    finds the prompts of the one before it in the server's prefix cache (a 256-stream level after a
    64-stream one with the same prompts once measured the cache: 1.4x the engine's own rate)."""
    return [(level, replace(config, seed=config.seed + i)) for i, level in enumerate(levels)]


def format_level(r: LevelResult) -> str:
    def ms(spread: Spread | None) -> str:
        return "-" if spread is None else f"mean {spread.mean:.1f} p50 {spread.p50:.1f} p99 {spread.p99:.1f} ms"

    return (
        f"concurrency {r.concurrency}: {r.num_completed} requests in {r.duration:.2f} s, "
        f"{r.requests_per_second:.2f} requests/s, {r.output_tokens_per_second:.1f} output tokens/s\n"
        f"  TTFT {ms(r.ttft)}\n  TPOT {ms(r.tpot)}\n  ITL  {ms(r.itl)}"
    )


def level_record(r: LevelResult) -> dict[str, object]:
    return {**asdict(r), "requests_per_second": r.requests_per_second, "output_tokens_per_second": r.output_tokens_per_second}


def vars_of(args: argparse.Namespace) -> dict[str, object]:
    """The flags as JSON values (no functions, paths as strings)."""
    plain = (str, int, float, bool, type(None))
    return {k: (v if isinstance(v, plain) else str(v)) for k, v in vars(args).items() if k not in ("func", "command_line")}


def _write_json(path: Path | None, record: dict[str, object]) -> None:
    if path is not None:
        path.write_text(json.dumps(record, indent=2) + "\n")
