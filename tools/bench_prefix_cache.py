"""Multi-turn chat on a KV cache too small for it: WiCore's A2CR and LRU eviction policies on one workload.

U users chat with the model for T turns each, under one shared system prompt. Every turn's
prompt is the user's whole conversation so far, in Gemma's chat format, token for token:

    turn 0   | BOS <start_of_turn>user SYSTEM \\n\\n | m0 <end..> <start_of_turn>model |
    turn 1   | BOS <start_of_turn>user SYSTEM \\n\\n | m0 <end..> <start_of_turn>model | a0 <end..> <start..>user m1 ... model |
    turn 2   |               ...                    |              ...               |          ...          | a1 ... m2 ... |
              \\__ the same for every user ______/ \\___ this user's own: reusable while its blocks stay cached ___/

m = a user message (text chosen by the seed), a = the model's own greedy answer (--answer-tokens,
ignore_eos), so the KV written while decoding an answer is what the user's next turn can reuse.
Users take turns round robin, each round in an order shuffled by (--seed, round); by default one
request runs at a time (--concurrency 1), and a user's turn always waits for their previous one.
--visitors V adds V one-off visitors to every round (one turn each, same system prompt), at random
places in it. Between two turns of one user, the others' requests push its blocks down the tiers:

    DEVICE (tier 0)  --device-conversations x the blocks of the longest conversation, + the sink
    HOST   (tier 1)  --host-conversations x the same; no NVMe. A block pushed out of HOST is gone.

Each policy gets a fresh engine and the identical workload: the same order, and every prompt of the
same length (answers have a fixed length; the JSON records whether their tokens matched too).

    prefix hit rate   = prompt tokens found in the prefix cache (any tier) / prompt tokens  (engine stats)
    returning hits    = the same over turns >= 1 only
    computed          = prompt tokens run through the model (engine stats)
    TTFT              = add_request to the first token, as the client sees it
    total             = first request added to the last token received

A2CR scores blocks by attention mass, frequency and recency; the attention term is fed only when the
exported model reports attention mass (the tool says whether it does).

Run from the repository root as a script (`python tools/bench_prefix_cache.py`): the shared helpers
come from the sibling modules benchlib.py and workloads.py, then on sys.path. When --model-dir
holds no exported model, Gemma 3 270M is exported there first (--op-flavour).

Usage:
    python tools/bench_prefix_cache.py --model-dir models/gemma3-270m --json prefix.json
    python tools/bench_prefix_cache.py --users 3 --turns 2 --answer-tokens 8 --system-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchlib import (
    CpuWatch,
    EngineUnavailable,
    add_measure_args,
    add_model_args,
    ensure_model,
    load_tokenizer,
    measure_calmest,
    others_cell,
    percentile,
    run_tool,
    stream_tokens,
    warm_engine,
    write_record,
)
from workloads import Workload, build_workload, unbounded_cache

POLICIES = ("a2cr", "lru")
BLOCK_SIZE = 16
WARMUP_TEXT = "Hello"  # with 2 new tokens, shorter than a block: nothing of it enters the prefix cache


@dataclass(frozen=True)
class TurnRecord:
    user: int
    turn: int
    num_prompt_tokens: int
    num_cached_tokens: int  # found in the prefix cache when admitted
    arrival: float  # seconds from the first request
    first_token: float
    last_token: float
    answer_ids: tuple[int, ...]


@dataclass(frozen=True)
class Run:
    """One policy's pass over the workload, as measured."""

    records: tuple[TurnRecord, ...]
    stats_delta: dict[str, int]  # engine stats counters over the workload
    moves: dict[str, int]  # "src->dst" block moves over the workload ("dropped" = evicted for good)
    num_other_busy_cores: float | None


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    prefix_hit_rate: float
    returning_hit_rate: float  # turns >= 1 only
    num_prompt_tokens: int
    num_cached_tokens: int
    num_computed_prompt_tokens: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    total_seconds: float
    moves: dict[str, int]
    num_preempted: int
    num_other_busy_cores: float | None
    num_attempts: int
    records: tuple[TurnRecord, ...]


@dataclass(frozen=True)
class BenchConfig:
    policies: tuple[str, ...]
    threads: int
    num_users: int
    num_turns: int
    num_visitors: int  # one-off visitors per round
    num_system_tokens: int
    num_answer_tokens: int
    device_conversations: float
    host_conversations: float
    num_device_blocks: int | None
    num_host_blocks: int | None
    concurrency: int
    num_retries: int
    max_wait_s: float
    seed: int
    wicore_model: Path
    op_flavour: str
    json_path: Path | None

    def __post_init__(self) -> None:
        unknown = set(self.policies) - set(POLICIES)
        if unknown or not self.policies:
            raise ValueError(f"--policies: choose from {', '.join(POLICIES)}")
        if min(self.threads, self.num_users, self.num_turns, self.concurrency) < 1 or self.num_visitors < 0:
            raise ValueError("--threads, --users, --turns and --concurrency must be at least 1, --visitors >= 0")
        if self.num_system_tokens < 1 or self.num_answer_tokens < 1:
            raise ValueError("--system-tokens and --answer-tokens must be at least 1")
        if self.device_conversations <= 0 or self.host_conversations < 0 or self.num_retries < 0:
            raise ValueError("--device-conversations must be > 0, --host-conversations and --retries >= 0")


# --------------------------------------------------------------------------- cache sizes


def tier_blocks(workload: Workload, config: BenchConfig) -> tuple[int, int]:
    """(DEVICE blocks with the sink, HOST blocks): sized in conversations unless given exactly.

    DEVICE never gets fewer than the longest request needs (the engine refuses such a request).
    """
    per_conversation = -(-workload.num_max_conversation_tokens // BLOCK_SIZE)
    device = config.num_device_blocks or math.ceil(config.device_conversations * per_conversation) + 1
    host = (
        config.num_host_blocks if config.num_host_blocks is not None else math.ceil(config.host_conversations * per_conversation)
    )
    return max(device, per_conversation + 1), host


# --------------------------------------------------------------------------- run


def pager_moves(engine) -> dict[tuple[str, str], int]:
    """Blocks moved so far, by (source tier, destination tier), over the engine's block groups."""
    moves: dict[tuple[str, str], int] = {}
    for pager in engine.core.kv.pagers:
        for pair, n in pager.stats.num_moves.items():
            moves[pair] = moves.get(pair, 0) + n
    return moves


def run_policy(
    policy: str, workload: Workload, config: BenchConfig, num_blocks: tuple[int, int], encode: Callable[..., list[int]]
) -> Run:
    from wicore.engine.engine import EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.types.sampling import SamplingParams

    engine_config = EngineConfig(
        model_dir=config.wicore_model,
        num_threads=config.threads,
        block_size=BLOCK_SIZE,
        num_device_blocks=num_blocks[0],
        num_host_blocks=num_blocks[1],
        num_nvme_blocks=0,
        policy=policy,
        scheduler=SchedulerConfig(max_num_seqs=config.concurrency),
        verify_files=False,
    )
    params = SamplingParams(max_tokens=workload.num_answer_tokens, ignore_eos=True)
    with warm_engine(engine_config, encode(WARMUP_TEXT)) as engine:
        before, moves_before = engine.stats(), pager_moves(engine)
        with CpuWatch() as watch:
            records = asyncio.run(drive(engine, workload, params, config.concurrency))
        after, moves_after = engine.stats(), pager_moves(engine)
    counters = ("prompt_tokens", "cached_prompt_tokens", "computed_prompt_tokens", "preempted_swap", "preempted_recompute")
    moves = {f"{src}->{dst}": n - moves_before.get((src, dst), 0) for (src, dst), n in sorted(moves_after.items())}
    return Run(
        records=records,
        stats_delta={k: after[k] - before[k] for k in counters},
        moves={k: n for k, n in moves.items() if n},
        num_other_busy_cores=watch.num_other_busy_cores,
    )


async def drive(engine, workload: Workload, params, concurrency: int) -> tuple[TurnRecord, ...]:
    """Send the turns in order, at most `concurrency` at a time, each after the user's previous turn ended."""
    start = time.perf_counter()

    async def send(user: int, turn: int, prompt: list[int]) -> tuple[tuple[int, ...], TurnRecord]:
        arrival = time.perf_counter() - start
        request_id = engine.add_request(prompt, params)
        times, ids, out = await stream_tokens(engine, request_id, start, f"user {user} turn {turn}")
        record = TurnRecord(user, turn, out.num_prompt_tokens, out.num_cached_tokens, arrival, times[0], times[-1], tuple(ids))
        return tuple(ids), record

    return tuple(await workload.run_turns(concurrency, send))


def summarize(policy: str, run: Run, num_attempts: int) -> PolicyResult:
    records = run.records
    ttfts = [r.first_token - r.arrival for r in records]
    returning = [r for r in records if r.turn > 0]
    num_returning = sum(r.num_prompt_tokens for r in returning)
    stats = run.stats_delta
    return PolicyResult(
        policy=policy,
        prefix_hit_rate=stats["cached_prompt_tokens"] / stats["prompt_tokens"],
        returning_hit_rate=sum(r.num_cached_tokens for r in returning) / num_returning if num_returning else math.nan,
        num_prompt_tokens=stats["prompt_tokens"],
        num_cached_tokens=stats["cached_prompt_tokens"],
        num_computed_prompt_tokens=stats["computed_prompt_tokens"],
        ttft_mean_s=statistics.fmean(ttfts),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        total_seconds=max(r.last_token for r in records),
        moves=run.moves,
        num_preempted=stats["preempted_swap"] + stats["preempted_recompute"],
        num_other_busy_cores=run.num_other_busy_cores,
        num_attempts=num_attempts,
        records=records,
    )


# --------------------------------------------------------------------------- report


def markdown_table(results: list[PolicyResult]) -> str:
    lines = [
        (
            "| policy | prefix hit rate | returning hit rate | prompt tokens computed | TTFT mean ms | TTFT p50 ms "
            "| TTFT p99 ms | total s | host->device | device->host | dropped | others' cores |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        others = others_cell(r.num_other_busy_cores, r.num_attempts)
        dropped = sum(n for k, n in r.moves.items() if k.endswith("->dropped"))
        lines.append(
            f"| {r.policy} | {r.prefix_hit_rate:.1%} | {r.returning_hit_rate:.1%} "
            f"| {r.num_computed_prompt_tokens} of {r.num_prompt_tokens} | {1000 * r.ttft_mean_s:.0f} "
            f"| {1000 * r.ttft_p50_s:.0f} | {1000 * r.ttft_p99_s:.0f} | {r.total_seconds:.1f} "
            f"| {r.moves.get('host->device', 0)} | {r.moves.get('device->host', 0)} | {dropped} | {others} |"
        )
    return "\n".join(lines)


def answers_match(results: list[PolicyResult]) -> bool:
    """Whether every policy's run produced the same answer tokens (and so the same prompts)."""
    answers = [{(r.user, r.turn): r.answer_ids for r in result.records} for result in results]
    return all(a == answers[0] for a in answers)


# --------------------------------------------------------------------------- cli


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICIES), help="from: " + ", ".join(POLICIES))
    parser.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    parser.add_argument("--users", type=int, default=8, help="users chatting at once (default 8)")
    parser.add_argument("--turns", type=int, default=4, help="turns per user (default 4)")
    parser.add_argument("--visitors", type=int, default=0, help="one-off visitors per round (one turn each)")
    parser.add_argument("--system-tokens", type=int, default=300, help="shared system prompt length in tokens")
    parser.add_argument("--answer-tokens", type=int, default=48, help="tokens of each answer (ignore_eos)")
    parser.add_argument("--device-conversations", type=float, default=1.5, help="tier 0 size, in longest conversations")
    parser.add_argument("--host-conversations", type=float, default=1.5, help="tier 1 size, in longest conversations")
    parser.add_argument("--device-blocks", type=int, help="exact tier 0 blocks (the sink included), overriding the above")
    parser.add_argument("--host-blocks", type=int, help="exact tier 1 blocks, overriding the above")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at most (default 1)")
    add_measure_args(parser)
    parser.add_argument("--seed", type=int, default=0, help="messages and turn order")
    add_model_args(parser)
    parser.add_argument("--json", type=Path, help="also write a JSON record (every turn's numbers) here")
    args = parser.parse_args(argv)
    return BenchConfig(
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
        threads=args.threads,
        num_users=args.users,
        num_turns=args.turns,
        num_visitors=args.visitors,
        num_system_tokens=args.system_tokens,
        num_answer_tokens=args.answer_tokens,
        device_conversations=args.device_conversations,
        host_conversations=args.host_conversations,
        num_device_blocks=args.device_blocks,
        num_host_blocks=args.host_blocks,
        concurrency=args.concurrency,
        num_retries=args.retries,
        max_wait_s=args.max_wait,
        seed=args.seed,
        wicore_model=args.model_dir,
        op_flavour=args.op_flavour,
        json_path=args.json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(argv, parse_args, run)


def run(config: BenchConfig, num_busy_before: float | None) -> int:
    """Every policy on the same workload, then the table (and the record)."""
    try:
        tokenizer, manifest = load_tokenizer(ensure_model(config.wicore_model, config.op_flavour))
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    has_attention = manifest.has_attention_stats
    workload = build_workload(
        tokenizer.encode,
        config.num_users,
        config.num_turns,
        config.num_system_tokens,
        config.num_answer_tokens,
        config.seed,
        config.num_visitors,
    )
    num_blocks = tier_blocks(workload, config)
    results = []
    for policy in config.policies:
        print(f"[{policy}] {len(workload.order)} turns ...", file=sys.stderr, flush=True)
        run, attempts = measure_calmest(
            policy,
            functools.partial(run_policy, policy, workload, config, num_blocks, tokenizer.encode),
            config.num_retries,
            config.max_wait_s,
        )
        results.append(summarize(policy, run, attempts))
        gc.collect()

    per_conversation = -(-workload.num_max_conversation_tokens // BLOCK_SIZE)
    ceiling, working_set = unbounded_cache(workload, BLOCK_SIZE)
    print(
        f"Gemma 3 270M multi-turn chat: {config.num_users} users x {config.num_turns} turns "
        f"+ {config.num_visitors} one-off visitors a round, "
        f"{config.num_system_tokens}-token shared system prompt, {config.num_answer_tokens}-token answers, "
        f"concurrency {config.concurrency}, {config.threads} threads, seed {config.seed}\n"
        f"tiers: DEVICE {num_blocks[0] - 1} blocks + sink, HOST {num_blocks[1]} blocks, no NVMe; longest "
        f"conversation {workload.num_max_conversation_tokens} tokens = {per_conversation} blocks of {BLOCK_SIZE}; "
        f"working set {working_set} blocks\n"
        f"hit rate of a cache that never evicts (the ceiling): {ceiling:.1%}\n"
        f"A2CR attention signal: {'on' if has_attention else 'off (the model does not report attention mass)'}\n"
    )
    print(markdown_table(results))
    is_same = answers_match(results)
    if len(results) > 1:
        print(f"\nanswers identical across policies: {'yes' if is_same else 'no (prompt lengths and order still are)'}")
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            num_device_blocks=num_blocks[0],
            num_host_blocks=num_blocks[1],
            num_max_conversation_tokens=workload.num_max_conversation_tokens,
            has_attention_signal=has_attention,
            unbounded_hit_rate=ceiling,
            num_working_set_blocks=working_set,
            answers_identical=is_same,
            order=workload.order,
            results=[asdict(r) for r in results],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
