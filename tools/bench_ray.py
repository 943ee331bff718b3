"""WiCore on Ray Serve (wicore.serve_ray): aggregate throughput with 1 and 2 engine replicas, and the
prefix-cache hit rate with prefix-aware routing against round-robin.

Throughput: the same R concurrent requests (Gemma 3 270M, greedy, --max-tokens each) through the
OpenAI endpoint (HTTP, the openai-compatible JSON API) of
    plain      one `wicore serve` (no Ray): one engine, --threads threads
    ray 1x     Ray Serve, 1 replica with --threads threads
    ray 2x     Ray Serve, 2 replicas with --threads / 2 threads each
aggregate tok/s = completion tokens of all requests / wall time from the first sent to the last done.
Each server is warmed up first (a few requests that are not counted).

Hit rate: tools/bench_prefix_cache.py's multi-turn workload (workloads.build_workload: users chatting
under one shared system prompt, every turn's prompt the whole conversation so far), sent with
--concurrency turns in flight to 2 replicas through the engine deployment's DeploymentHandle (the
handle's router is the one under test; the prompts need the answers' token ids, which the handle
returns), once with each router. KV pools large enough that nothing is evicted: only routing decides.
    hit rate = prompt tokens found in the serving replica's prefix cache / prompt tokens

Run from the repository root as a script; a local Ray cluster is started with --threads CPUs.

Usage:
    python tools/bench_ray.py --model-dir models/gemma3-270m --json docs/results/ray-serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from benchlib import add_model_args, ensure_model, load_tokenizer, run_tool, write_record
from workloads import Workload, build_workload, unbounded_cache

TOPICS = ("France", "the ocean", "a cat", "Mars", "bread", "music", "winter", "a robot")


@dataclass(frozen=True)
class BenchConfig:
    threads: int
    num_requests: int
    max_tokens: int
    num_users: int
    num_turns: int
    num_system_tokens: int
    num_answer_tokens: int
    concurrency: int
    seed: int
    wicore_model: Path
    op_flavour: str
    json_path: Path | None


def engine_config(config: BenchConfig, num_threads: int):
    from wicore.engine.engine import EngineConfig

    return EngineConfig(model_dir=config.wicore_model, num_threads=num_threads, verify_files=False, kv_pool_gb=0.5)


def cluster_config(config: BenchConfig, num_replicas: int, routing: str, app_name: str):
    from wicore.api.settings import ServerSettings
    from wicore.serve_ray.app import ClusterConfig

    threads = max(1, config.threads // num_replicas)
    return ClusterConfig(
        engine_config(config, threads),
        ServerSettings(model_name="gemma3-270m"),
        num_replicas=num_replicas,
        num_cpus_per_replica=threads,
        routing=routing,
        app_name=app_name,
    )


# -- throughput ------------------------------------------------------------------------------
async def send_all(url: str, prompts: Sequence[str], max_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) of all prompts sent at once."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(prompt: str) -> int:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        started = time.perf_counter()
        tokens = await asyncio.gather(*(one(p) for p in prompts))
        return sum(tokens), time.perf_counter() - started


def throughput(url: str, config: BenchConfig) -> dict[str, float]:
    prompts = [
        f"Write a long story about {TOPICS[i % len(TOPICS)]}, part {i // len(TOPICS) + 1}:" for i in range(config.num_requests)
    ]
    asyncio.run(send_all(url, prompts[:4], 4))  # warm-up: every replica's first steps
    tokens, seconds = asyncio.run(send_all(url, prompts, config.max_tokens))
    return {"completion_tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}


def plain_throughput(config: BenchConfig) -> dict[str, float]:
    from wicore.api.app import ServerSettings, create_app
    from wicore.api.server import ServerThread
    from wicore.engine.engine import Engine

    with Engine(engine_config(config, config.threads)).start() as engine:
        server = ServerThread(create_app(engine, ServerSettings(model_name="gemma3-270m"))).start()
        try:
            return throughput(server.url, config)
        finally:
            server.stop()


def ray_throughput(config: BenchConfig, num_replicas: int, port: int) -> dict[str, float]:
    from ray import serve

    from wicore.serve_ray.app import application

    app = f"throughput-{num_replicas}x"
    serve.run(application(cluster_config(config, num_replicas, "prefix", app)), name=app, route_prefix="/")
    try:
        return throughput(f"http://127.0.0.1:{port}", config)
    finally:
        serve.delete(app)


# -- prefix-cache hit rate ---------------------------------------------------------------------
async def drive(handle, workload: Workload, config: BenchConfig) -> tuple[int, int]:
    """Send the turns in order (a user's turn after their previous one), `concurrency` at a time;
    (prompt tokens, of those found in the prefix cache)."""
    from wicore.serve_ray.replica import EngineCall
    from wicore.types.sampling import SamplingParams

    params = SamplingParams(max_tokens=workload.num_answer_tokens, ignore_eos=True)
    generate = handle.options(method_name="generate", stream=True)

    async def send(user: int, turn: int, prompt: list[int]) -> tuple[list[int], tuple[int, int]]:
        ids: list[int] = []
        cached = 0
        async for out in generate.remote(EngineCall(f"u{user}-t{turn}", prompt, params)):
            if isinstance(out, Exception):
                raise out
            ids += out.new_token_ids
            if out.finished:
                cached = out.num_cached_tokens
        return ids, (len(prompt), cached)

    counts = await workload.run_turns(config.concurrency, send)
    return sum(n for n, _ in counts), sum(c for _, c in counts)


def hit_rate(config: BenchConfig, workload: Workload, routing: str) -> dict[str, object]:
    """One fresh application per router: a process keeps one router per deployment (by app and
    deployment name), so reusing the name would reuse the first router."""
    import ray
    from ray import serve

    from wicore.serve_ray.app import application
    from wicore.serve_ray.board import stats_board

    app = f"hit-rate-{routing}"
    serve.run(application(cluster_config(config, 2, routing, app)), name=app, route_prefix="/")
    try:
        handle = serve.get_deployment_handle("WiCoreEngine", app_name=app)
        started = time.perf_counter()
        prompt, cached = asyncio.run(drive(handle, workload, config))
        seconds = time.perf_counter() - started
        time.sleep(2.5)  # the replicas post their stats every second
        per_replica = {r["replica"]: r["stats"]["prompt_tokens"] for r in ray.get(stats_board(app).read.remote(5.0))}
        return {
            "prompt_tokens": prompt,
            "cached_prompt_tokens": cached,
            "hit_rate": cached / prompt,
            "seconds": seconds,
            "prompt_tokens_per_replica": per_replica,
        }
    finally:
        serve.delete(app)


# -- the tool ----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="cores to use: the Ray cluster's CPUs (default 2)")
    parser.add_argument("--requests", type=int, default=16, help="throughput: concurrent requests (default 16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="throughput: tokens each (default 64)")
    parser.add_argument("--users", type=int, default=8, help="hit rate: users chatting (default 8)")
    parser.add_argument("--turns", type=int, default=4, help="hit rate: turns per user (default 4)")
    parser.add_argument("--system-tokens", type=int, default=128, help="hit rate: shared system prompt tokens")
    parser.add_argument("--answer-tokens", type=int, default=16, help="hit rate: tokens of each answer (ignore_eos)")
    parser.add_argument("--concurrency", type=int, default=4, help="hit rate: turns in flight at most (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    add_model_args(parser)
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    if args.threads < 2:
        raise ValueError("--threads must be at least 2 (two replicas get one each)")
    return BenchConfig(
        args.threads,
        args.requests,
        args.max_tokens,
        args.users,
        args.turns,
        args.system_tokens,
        args.answer_tokens,
        args.concurrency,
        args.seed,
        args.model_dir,
        args.op_flavour,
        args.json,
    )


def run(config: BenchConfig, num_busy_before: float | None) -> int:
    import ray
    from ray import serve

    from wicore.api.server import free_port

    tokenizer, _ = load_tokenizer(ensure_model(config.wicore_model, config.op_flavour))
    config = replace(config, wicore_model=config.wicore_model.resolve())
    workload = build_workload(
        tokenizer.encode, config.num_users, config.num_turns, config.num_system_tokens, config.num_answer_tokens, config.seed
    )
    print("[plain] one wicore serve ...", file=sys.stderr, flush=True)
    rates = {"plain": plain_throughput(config)}
    port = free_port()
    ray.init(num_cpus=config.threads, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for n in (1, 2):
            print(f"[ray {n}x] ...", file=sys.stderr, flush=True)
            rates[f"ray {n}x"] = ray_throughput(config, n, port)
        hits = {}
        for routing in ("prefix", "round-robin"):
            print(f"[hit rate, {routing}] {len(workload.order)} turns ...", file=sys.stderr, flush=True)
            hits[routing] = hit_rate(config, workload, routing)
    finally:
        serve.shutdown()
        ray.shutdown()
    ceiling, _ = unbounded_cache(workload, 16)
    print(f"\nthroughput: {config.num_requests} concurrent requests, {config.max_tokens} tokens each, {config.threads} cores")
    print("| server | replicas x threads | completion tokens | seconds | aggregate tok/s |\n|---|---|---|---|---|")
    for name, r in rates.items():
        shape = {"plain": f"1 x {config.threads}", "ray 1x": f"1 x {config.threads}", "ray 2x": f"2 x {config.threads // 2}"}[
            name
        ]
        print(f"| {name} | {shape} | {r['completion_tokens']} | {r['seconds']:.1f} | {r['tokens_per_second']:.1f} |")
    print(f"\nhit rate: {config.num_users} users x {config.num_turns} turns, concurrency {config.concurrency}, 2 replicas")
    print(f"(one cache that never evicts, requests one at a time: {ceiling:.1%})")
    print("| routing | prompt tokens | cached | hit rate | prompt tokens per replica | seconds |\n|---|---|---|---|---|---|")
    for name, h in hits.items():
        split = " / ".join(str(n) for n in h["prompt_tokens_per_replica"].values())  # type: ignore[attr-defined]
        print(
            f"| {name} | {h['prompt_tokens']} | {h['cached_prompt_tokens']} | {h['hit_rate']:.1%} | {split} | {h['seconds']:.1f} |"
        )
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            throughput=rates,
            hit_rate=hits,
            unbounded_hit_rate=ceiling,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(argv, parse_args, run)


if __name__ == "__main__":
    sys.exit(main())
