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
Between two turns of one user, the others' conversations push its blocks down the tiers:

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
come from the sibling tools/bench_serving.py and tools/bench_generate.py, which are then on sys.path.

Usage:
    python tools/bench_prefix_cache.py --wicore-model models/gemma3-270m --json prefix.json
    python tools/bench_prefix_cache.py --users 3 --turns 2 --answer-tokens 8 --system-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import gc
import json
import math
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench_generate import EngineUnavailable, machine_info, warn_if_busy
from bench_serving import CpuWatch, git_revision, measure, percentile

POLICIES = ("a2cr", "lru")
BLOCK_SIZE = 16
WARMUP_TEXT = "Hello"  # with 2 new tokens, shorter than a block: nothing of it enters the prefix cache

SYSTEM_PROMPT = (
    "You are Atlas, the support assistant of Northwind Outfitters, a company that sells hiking, camping "
    "and climbing equipment online and in twelve stores. Answer in a friendly, concise and accurate way. "
    "Follow these rules in every conversation. First, never invent order numbers, prices, delivery dates "
    "or stock levels: when you do not know them, say so and explain how the customer can find out. "
    "Second, for safety questions about climbing ropes, harnesses, helmets, stoves or avalanche gear, "
    "give general guidance only and always recommend the manufacturer's instructions and a certified "
    "instructor. Third, returns are accepted within sixty days with a receipt; worn footwear can be "
    "returned within thirty days if it shows no damage beyond normal indoor testing. Fourth, members of "
    "the Trail Club get free shipping, a ten percent discount on full-price items and early access to "
    "seasonal sales; membership is free and can be cancelled at any time. Fifth, repairs of tents, "
    "sleeping bags and jackets are done in the Portland workshop and usually take two to three weeks. "
    "Sixth, if a customer is upset, acknowledge the problem, apologise once, and focus on what can be "
    "done next. Seventh, keep personal data private: never repeat a full address, phone number or card "
    "number back to the customer. Eighth, when recommending products, ask about the trip first: the "
    "season, the terrain, the number of people, the expected weather and the budget. Ninth, answer in "
    "the customer's language when you can, and keep answers under two hundred words unless the "
    "customer asks for detail. Tenth, end every answer by asking whether there is anything else you "
    "can help with today."
)

TOPICS = (
    ("a tent for a family of four", "We camp by lakes in summer and sometimes get heavy rain."),
    ("returning hiking boots", "I wore them twice on short walks and they hurt my heels."),
    ("choosing a sleeping bag", "I am going to the Alps in October and sleep cold."),
    ("a delayed order", "I ordered a stove and two gas canisters nine days ago."),
    ("a first climbing harness", "I just started at an indoor gym and want my own gear."),
    ("repairing a torn jacket", "The zip came off and there is a small tear near the pocket."),
    ("Trail Club membership", "My partner and I both shop with you a few times a year."),
    ("winter gear for a beginner", "I want to try snowshoeing in January for the first time."),
    ("a backpack for long trips", "I plan a two-week hike with food drops every four days."),
    ("a water filter", "We will drink from streams in a national park next month."),
)

FOLLOW_UPS = (
    "Thanks. Could you explain that in a bit more detail?",
    "What would you recommend if my budget were smaller?",
    "Is there anything I should watch out for?",
    "How long would that take, roughly?",
    "Could you compare the two options you mentioned?",
    "And what if the weather turns bad halfway through?",
    "Does the Trail Club discount apply to this as well?",
    "Can I pick it up in a store instead of waiting for delivery?",
    "What do other customers usually choose in my situation?",
    "Could you summarise what I should do next, step by step?",
)


@dataclass(frozen=True)
class Workload:
    """Token pieces of every (user, turn) and the order the turns are sent in.

    prompt(u, t) = pieces[u][0] + answers[u][0] + pieces[u][1] + ... + answers[u][t-1] + pieces[u][t]
    """

    pieces: tuple[tuple[tuple[int, ...], ...], ...]  # [user][turn]
    order: tuple[tuple[int, int], ...]  # (user, turn), in sending order
    num_answer_tokens: int

    def prompt(self, user: int, turn: int, answers: dict[tuple[int, int], Sequence[int]]) -> list[int]:
        ids: list[int] = []
        for t in range(turn):
            ids += self.pieces[user][t]
            ids += answers[user, t]
        return ids + list(self.pieces[user][turn])

    def num_prompt_tokens(self, user: int, turn: int) -> int:
        return sum(len(p) for p in self.pieces[user][: turn + 1]) + turn * self.num_answer_tokens

    @property
    def num_max_conversation_tokens(self) -> int:
        """Tokens of the longest conversation at its end: last prompt + last answer."""
        last = len(self.pieces[0]) - 1
        return max(self.num_prompt_tokens(u, last) for u in range(len(self.pieces))) + self.num_answer_tokens


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
    json_path: Path | None

    def __post_init__(self) -> None:
        unknown = set(self.policies) - set(POLICIES)
        if unknown or not self.policies:
            raise ValueError(f"--policies: choose from {', '.join(POLICIES)}")
        if min(self.threads, self.num_users, self.num_turns, self.concurrency) < 1:
            raise ValueError("--threads, --users, --turns and --concurrency must be at least 1")
        if self.num_system_tokens < 1 or self.num_answer_tokens < 1:
            raise ValueError("--system-tokens and --answer-tokens must be at least 1")
        if self.device_conversations <= 0 or self.host_conversations < 0:
            raise ValueError("--device-conversations must be > 0 and --host-conversations >= 0")
        if self.num_retries < 0:
            raise ValueError("--retries must be >= 0")


# --------------------------------------------------------------------------- workload


def build_workload(encode: Callable[..., list[int]], config: BenchConfig) -> Workload:
    """Users, their messages and the round-robin order, all from `config.seed`."""
    rng = random.Random(config.seed)
    system_ids = encode(SYSTEM_PROMPT, add_bos=False)
    while len(system_ids) < config.num_system_tokens:
        system_ids += encode(" " + SYSTEM_PROMPT, add_bos=False)
    system_ids = system_ids[: config.num_system_tokens]
    head = encode("<start_of_turn>user\n", add_bos=True) + system_ids  # BOS first
    topics = [TOPICS[u % len(TOPICS)] for u in range(config.num_users)]
    pieces = []
    for user, (topic, detail) in enumerate(topics):
        opening = f"\n\nHi, this is customer {user + 1}. I need help with {topic}. {detail}"
        turns = [tuple(head + encode(opening + "<end_of_turn>\n<start_of_turn>model\n", add_bos=False))]
        for _ in range(1, config.num_turns):
            message = f"{rng.choice(FOLLOW_UPS)} (This is still about {topic}.)"
            turns.append(
                tuple(encode(f"<end_of_turn>\n<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n", add_bos=False))
            )
        pieces.append(tuple(turns))
    order = []
    for turn in range(config.num_turns):
        users = list(range(config.num_users))
        random.Random(f"{config.seed}:{turn}").shuffle(users)
        order += [(u, turn) for u in users]
    return Workload(tuple(pieces), tuple(order), config.num_answer_tokens)


def unbounded_cache(workload: Workload) -> tuple[float, int]:
    """(prefix hit rate, blocks cached at the end) of a cache that never evicts, requests served one
    at a time in order: the ceiling of any policy, and the working set it needs. Answers are stand-in
    ids (only which tokens are equal matters)."""
    answers = {
        (u, t): tuple(-1 - (u * len(workload.pieces[0]) + t) * workload.num_answer_tokens - i for i in range(workload.num_answer_tokens))
        for u, t in workload.order
    }
    cached: set[tuple[int, ...]] = set()  # token prefixes ending at a block boundary
    num_hits = num_tokens = 0
    for user, turn in workload.order:
        prompt = workload.prompt(user, turn, answers)
        num_blocks = 0
        while num_blocks < (len(prompt) - 1) // BLOCK_SIZE and tuple(prompt[: (num_blocks + 1) * BLOCK_SIZE]) in cached:
            num_blocks += 1
        num_hits += num_blocks * BLOCK_SIZE
        num_tokens += len(prompt)
        written = prompt + list(answers[user, turn][:-1])  # the last answer token's KV is never computed
        cached.update(tuple(written[: (b + 1) * BLOCK_SIZE]) for b in range(len(written) // BLOCK_SIZE))
    return num_hits / num_tokens, len(cached)


def tier_blocks(workload: Workload, config: BenchConfig) -> tuple[int, int]:
    """(DEVICE blocks with the sink, HOST blocks): sized in conversations unless given exactly.

    DEVICE never gets fewer than the longest request needs (the engine refuses such a request).
    """
    per_conversation = -(-workload.num_max_conversation_tokens // BLOCK_SIZE)
    device = config.num_device_blocks or math.ceil(config.device_conversations * per_conversation) + 1
    host = config.num_host_blocks if config.num_host_blocks is not None else math.ceil(config.host_conversations * per_conversation)
    return max(device, per_conversation + 1), host


# --------------------------------------------------------------------------- run


def run_policy(
    policy: str, workload: Workload, config: BenchConfig, num_blocks: tuple[int, int], encode: Callable[..., list[int]]
) -> Run:
    from wicore.runtime.engine import Engine, EngineConfig
    from wicore.runtime.sampler import SamplingParams
    from wicore.runtime.scheduler import SchedulerConfig

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
    with Engine(engine_config).start() as engine:
        engine.generate([encode(WARMUP_TEXT)], SamplingParams(max_tokens=2, ignore_eos=True))
        before, moves_before = engine.stats(), dict(engine.pager.stats.num_moves)
        with CpuWatch() as watch:
            records = asyncio.run(drive(engine, workload, params, config.concurrency))
        after, moves_after = engine.stats(), dict(engine.pager.stats.num_moves)
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
    answers: dict[tuple[int, int], tuple[int, ...]] = {}
    done = {key: asyncio.Event() for key in workload.order}
    slots = asyncio.Semaphore(concurrency)

    async def consume(user: int, turn: int, request_id: str, arrival: float) -> TurnRecord:
        try:
            times: list[float] = []
            ids: list[int] = []
            num_cached = 0
            async for out in engine.outputs(request_id):
                if out.finish_reason not in (None, "length"):
                    raise RuntimeError(f"user {user} turn {turn} ended with {out.finish_reason!r}: {out.error}")
                times += [time.perf_counter() - start] * len(out.new_token_ids)
                ids += out.new_token_ids
                num_cached = out.num_cached_tokens
            answers[user, turn] = tuple(ids)
            return TurnRecord(user, turn, out.num_prompt_tokens, num_cached, arrival, times[0], times[-1], tuple(ids))
        finally:
            done[user, turn].set()
            slots.release()

    tasks = []
    for user, turn in workload.order:
        if turn > 0:
            await done[user, turn - 1].wait()
        await slots.acquire()
        prompt = workload.prompt(user, turn, answers)
        arrival = time.perf_counter() - start
        tasks.append(asyncio.create_task(consume(user, turn, engine.add_request(prompt, params), arrival)))
    return tuple(await asyncio.gather(*tasks))


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
        others = "n/a" if r.num_other_busy_cores is None else f"{r.num_other_busy_cores:.2f}"
        if r.num_attempts > 1:
            others += f" ({r.num_attempts} tries)"
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


def write_json(path: Path, config: BenchConfig, header: dict[str, object], results: list[PolicyResult]) -> None:
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine_info(),
        "git_revision": git_revision(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        **header,
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


# --------------------------------------------------------------------------- cli


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICIES), help="from: " + ", ".join(POLICIES))
    parser.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    parser.add_argument("--users", type=int, default=8, help="users chatting at once (default 8)")
    parser.add_argument("--turns", type=int, default=4, help="turns per user (default 4)")
    parser.add_argument("--system-tokens", type=int, default=300, help="shared system prompt length in tokens")
    parser.add_argument("--answer-tokens", type=int, default=48, help="tokens of each answer (ignore_eos)")
    parser.add_argument("--device-conversations", type=float, default=1.5, help="tier 0 size, in longest conversations")
    parser.add_argument("--host-conversations", type=float, default=1.5, help="tier 1 size, in longest conversations")
    parser.add_argument("--device-blocks", type=int, help="exact tier 0 blocks (the sink included), overriding the above")
    parser.add_argument("--host-blocks", type=int, help="exact tier 1 blocks, overriding the above")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at most (default 1)")
    parser.add_argument("--retries", type=int, default=2, help="re-measurements when other processes compete")
    parser.add_argument("--max-wait", type=float, default=300, help="seconds to wait for idle cores before a measurement")
    parser.add_argument("--seed", type=int, default=0, help="messages and turn order")
    parser.add_argument("--wicore-model", type=Path, default=Path("models/gemma3-270m"), help="exported model folder")
    parser.add_argument("--json", type=Path, help="also write a JSON record (every turn's numbers) here")
    args = parser.parse_args(argv)
    return BenchConfig(
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
        threads=args.threads,
        num_users=args.users,
        num_turns=args.turns,
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
        wicore_model=args.wicore_model,
        json_path=args.json,
    )


def load_model(model_dir: Path):
    """(tokenizer, whether the model reports attention mass); verifies the files once."""
    if not model_dir.is_dir():
        raise EngineUnavailable(
            f"no exported WiCore model at {model_dir}; make one with "
            f"`wicore-export --model gemma3-270m --out {model_dir}` or pass --wicore-model DIR"
        )
    from wicore.export.tokenizer import TokenizerInfo
    from wicore.graph.manifest import Manifest
    from wicore.runtime.tokenizer import Tokenizer

    manifest = Manifest.read(model_dir)
    manifest.verify(model_dir)
    if manifest.tokenizer is None:
        raise EngineUnavailable(f"{model_dir} was exported without a tokenizer; export it again")
    has_attention = manifest.has_attention_stats
    return Tokenizer(model_dir, TokenizerInfo.from_dict(manifest.tokenizer)), has_attention


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    num_busy_before = warn_if_busy(config.threads)
    try:
        tokenizer, has_attention = load_model(config.wicore_model)
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    workload = build_workload(tokenizer.encode, config)
    num_blocks = tier_blocks(workload, config)
    results = []
    for policy in config.policies:
        print(f"[{policy}] {len(workload.order)} turns ...", file=sys.stderr, flush=True)
        run, attempts = measure(
            policy,
            functools.partial(run_policy, policy, workload, config, num_blocks, tokenizer.encode),
            config.num_retries,
            config.max_wait_s,
        )
        results.append(summarize(policy, run, attempts))
        gc.collect()

    per_conversation = -(-workload.num_max_conversation_tokens // BLOCK_SIZE)
    ceiling, working_set = unbounded_cache(workload)
    print(
        f"Gemma 3 270M multi-turn chat: {config.num_users} users x {config.num_turns} turns, "
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
        header = {
            "num_busy_cores_before": num_busy_before,
            "num_device_blocks": num_blocks[0],
            "num_host_blocks": num_blocks[1],
            "num_max_conversation_tokens": workload.num_max_conversation_tokens,
            "has_attention_signal": has_attention,
            "unbounded_hit_rate": ceiling,
            "num_working_set_blocks": working_set,
            "answers_identical": is_same,
            "order": workload.order,
        }
        write_json(config.json_path, config, header, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
