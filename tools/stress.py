"""Stress a running WiCore server: concurrent streaming clients, dropped streams, then check that it drained.

N clients, each an asyncio task sharing one official `openai` AsyncOpenAI client (no retries),
start spread evenly over --ramp seconds and loop until --duration seconds after the start (or
until --max-requests requests were started in all, or --requests-per-client by each):

    client i:  start at i * ramp / N ─┬─ request ─┬─ request ─┬─ ...   (no new request after --duration)
    request:   a prompt from a mixed set (a few words .. ~800 tokens), chat or completions,
               stream=True, temperature in {0, 0.7, 1.0}, max_tokens in --max-tokens LO,HI;
               a --disconnect-fraction of them close the stream after --disconnect-chunks LO,HI
               chunks (dropped on purpose: not errors)

Outcomes: ok (the stream ended with a finish reason), disconnected (on purpose), or an error
named by its HTTP status (`http 429`) or exception type (`APIConnectionError`, `APIError` for an
error event inside a stream, `no finish reason` for a stream that ended without one).
TTFT: from sending the request to the first chunk carrying text (ok and dropped requests);
latency: sending to the end of the stream (ok requests). Generated tok/s: the tokens the clients
received (usage of ok streams, text chunks of dropped ones) over the first send to the last end;
the server's own count (/v1/stats generated_tokens, tokens it computed for dropped streams too)
is reported beside it.

Around the clients: the server's RSS (/proc/PID/status VmRSS) every second, the process found
by --server-pid or, on Linux, as the one listening on the URL's port; /v1/stats every 5 s (how
full each KV tier is: the RSS when every tier is 90% full, and its growth after, are in the
record); a greedy completion before and after (the same text is expected); after the clients,
/v1/stats polled until running, waiting and every tier's blocks_referenced are 0 (--drain-timeout).

--sigterm-under-load S (with --spawn): after those checks the same load starts again and the
server gets SIGTERM S seconds later; every stream must then end, finished or with the 503
server_shutting_down event of a stream cut at the end of the grace period (--grace-seconds,
passed to the server), and the server must exit 0 within the grace (plus 10 s).

A server that goes away (stops answering) ends the run: the record is written all the same,
with what was measured and `server.gone` saying what failed, and the run fails.

Exit code 0 only if no request failed unexpectedly, the server drained to 0 running and 0
referenced blocks, the greedy text did not change and a spawned server exited 0; 1 otherwise,
2 for a usage error. Loopback URLs only: this tool is a load generator for one's own server.

--spawn runs `python -m wicore.cli serve --model MODEL --port P --threads T` itself on a free
loopback port (its log in --server-log), waits for /health and stops it with SIGTERM at the end.
The clients live in stress_clients.py, the server side (spawn, RSS, stats) in stress_server.py, the
report and its checks in stress_report.py.

Usage:
    python tools/stress.py --spawn --clients 8 --duration 40 --disconnect-fraction 0.2 --json stress.json
    python tools/stress.py --url http://127.0.0.1:8000 --server-pid 1234 --clients 64 --ramp 60 --duration 600
    python tools/stress.py --spawn --clients 64 --ramp 300 --duration 3600 --disconnect-fraction 0.1 \
        --serve-args='--kv-pool-gb 0.25 --host-tier-gb 0.25 --nvme-tier-gb 0.5' --sigterm-under-load 120 --json s.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from benchlib import run_tool, write_record
from stress_clients import Load, RequestResult, run_clients
from stress_report import Report, Shutdown, table
from stress_server import (
    RssSampler,
    ServerApi,
    Spawned,
    StatsSampler,
    listening_pid,
    server_error_lines,
    spawn_server,
)

PROBE_PROMPT = "The three primary colours are"
PROBE_TOKENS = 32


@dataclass(frozen=True)
class StressConfig:
    url: str | None  # None with --spawn: the spawned server's
    is_spawn: bool
    model: str  # what --spawn serves: an exported folder, or gemma3-270m
    threads: int  # the spawned server's --threads (and what the busy-core warning compares with)
    serve_args: tuple[str, ...]  # more `wicore serve` flags for --spawn
    server_log: Path | None
    server_pid: int | None
    api_key: str | None
    load: Load
    drain_timeout_s: float
    start_timeout_s: float
    is_probe: bool
    json_path: Path | None
    sigterm_under_load_s: float | None = None  # --spawn: SIGTERM this long into a second run of the load
    grace_s: float = 30.0  # the spawned server's --grace-seconds

    def __post_init__(self) -> None:
        if self.is_spawn == (self.url is not None):
            raise ValueError("give either --url (a running server) or --spawn, not both")
        if self.sigterm_under_load_s is not None and (not self.is_spawn or self.sigterm_under_load_s <= 0):
            raise ValueError("--sigterm-under-load takes seconds > 0, and --spawn (the tool stops the server itself)")
        if self.url is not None and not is_loopback_url(self.url):
            raise ValueError(f"--url {self.url!r} is not a loopback http URL (127.0.0.0/8, ::1 or localhost); refusing")
        if self.threads < 1:
            raise ValueError("--threads must be at least 1")


def is_loopback_url(url: str) -> bool:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https"):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- run


def stress(url: str, pid: int | None, config: StressConfig) -> Report:
    """The load against a server, and the checks after it. A server that stops answering after the
    load has started ends the run with what was measured (`server["gone"]`)."""
    api = ServerApi(url, config.api_key)
    model = api.model()
    api.check_chat(model)
    if pid is None:
        print("warning: no server process found (give --server-pid): RSS not sampled", file=sys.stderr)
    sampler = RssSampler(pid) if pid is not None else None
    server: dict = {"url": url, "pid": pid, "spawned": config.is_spawn}
    stats_drained = stats_final = None
    drain_s, after = 0.0, None
    with sampler or contextlib.nullcontext(), StatsSampler(url, config.api_key) as series:
        before = api.greedy(model, PROBE_PROMPT, PROBE_TOKENS) if config.is_probe else ""
        stats_before = api.stats()
        print(f"[stress] {config.load.num_clients} clients against {url} ({model}) ...", file=sys.stderr, flush=True)
        results, wall = asyncio.run(run_clients(url, model, config.load, config.api_key))
        try:
            stats_drained, drain_s = api.drain(config.drain_timeout_s)
            after = api.greedy(model, PROBE_PROMPT, PROBE_TOKENS) if config.is_probe else ""
            stats_final = api.drain(config.drain_timeout_s)[0] if config.is_probe else stats_drained
        except httpx.HTTPError as exc:
            server["gone"] = f"{type(exc).__name__}: {exc}"
            print(f"[stress] the server went away: {server['gone']}", file=sys.stderr, flush=True)
    return Report(
        results=results,
        wall_s=wall,
        stats_before=stats_before,
        stats_drained=stats_drained,
        stats_final=stats_final,
        drain_s=drain_s,
        rss=sampler.samples if sampler else [],
        probe=(before, after or "") if config.is_probe else None,
        server=server,
        stats_series=series.samples,
    )


def sigterm_under_load(spawned: Spawned, model: str, config: StressConfig) -> Shutdown:
    """The load again; SIGTERM `sigterm_under_load_s` into it (no request starts after); every
    stream's end, and how long the server took to exit."""
    after_s = config.sigterm_under_load_s
    assert after_s is not None
    # No request starts in the last second before SIGTERM: one sent as the server stops listening
    # would measure the race of its connection, not how the server ends the streams it has.
    quiet_s = max(after_s - 1.0, 0.0)
    load = replace(config.load, ramp_s=min(config.load.ramp_s, quiet_s), duration_s=quiet_s, max_requests=None)

    async def run() -> tuple[list[RequestResult], float]:
        clients = asyncio.ensure_future(run_clients(spawned.url, model, load, config.api_key))
        await asyncio.sleep(after_s)
        spawned.proc.send_signal(signal.SIGTERM)
        sent = time.perf_counter()
        print(f"[stress] SIGTERM to {spawned.pid} under load ...", file=sys.stderr, flush=True)
        results, _ = await clients
        return results, sent

    results, sent = asyncio.run(run())
    try:
        exit_code = spawned.proc.wait(timeout=max(0.0, config.grace_s + 30 - (time.perf_counter() - sent)))
        exit_s: float | None = time.perf_counter() - sent
    except subprocess.TimeoutExpired:
        exit_code, exit_s = None, None
    return Shutdown(results, after_s, exit_code, exit_s, config.grace_s)


def run(config: StressConfig, num_busy_before: float | None) -> int:
    try:
        if config.is_spawn:
            api_key = ["--api-key", config.api_key] if config.api_key else []
            serve_args = ["--model", config.model, "--threads", str(config.threads), *api_key, *config.serve_args]
            serve_args += ["--grace-seconds", f"{config.grace_s:g}"]
            with spawn_server(serve_args, config.server_log, config.start_timeout_s) as spawned:
                report = stress(spawned.url, spawned.pid, config)
                if config.sigterm_under_load_s is not None and not report.server.get("gone"):
                    report.shutdown = sigterm_under_load(spawned, ServerApi(spawned.url, config.api_key).model(), config)
            report.server.update(exit_code=spawned.exit_code, log=str(spawned.log_path))
            report.server["error_lines"] = server_error_lines(spawned.log_path)
        else:
            assert config.url is not None
            url = config.url.rstrip("/")
            pid = config.server_pid or listening_pid(urlsplit(url).port or 80)
            report = stress(url, pid, config)
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(report))
    for line in report.server.get("error_lines", []):
        print(f"server log: {line}")
    checks = report.checks()
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            passed=all(checks.values()),
            checks=checks,
            figures=report.figures(),
            server=report.server,
            stats_before=report.stats_before,
            stats_drained=report.stats_drained,
            stats_final=report.stats_final,
            drain_s=report.drain_s,
            probe=report.probe,
            rss=report.rss,
            stats_series=report.stats_series,
            shutdown=None
            if report.shutdown is None
            else {
                "sigterm_s": report.shutdown.sigterm_s,
                "exit_code": report.shutdown.exit_code,
                "exit_s": report.shutdown.exit_s,
                "grace_s": report.shutdown.grace_s,
                "outcomes": report.shutdown.outcomes(),
                "error_samples": {r.outcome: r.error for r in report.shutdown.results if r.outcome not in ("ok", "disconnected")},
                "requests": [
                    {"outcome": r.outcome, "started_s": round(r.started_s, 4), "latency_s": round(r.latency_s, 4)}
                    for r in report.shutdown.results
                ],
            },
            requests=[
                {
                    **asdict(r.plan),
                    "outcome": r.outcome,
                    "started_s": round(r.started_s, 4),
                    "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 4),
                    "latency_s": round(r.latency_s, 4),
                    "num_tokens": r.num_tokens,
                }
                for r in report.results
            ],
        )
    return 0 if all(checks.values()) else 1


# --------------------------------------------------------------------------- cli


def int_pair(text: str) -> tuple[int, int]:
    """ "8,64" -> (8, 64); "2" -> (2, 2)."""
    parts = [int(x) for x in text.split(",")]
    if len(parts) not in (1, 2):
        raise ValueError(f"{text!r}: give LO,HI")
    return parts[0], parts[-1]


def parse_args(argv: Sequence[str] | None) -> StressConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_argument_group("the server")
    where.add_argument("--url", help="a running server's base URL, loopback only (e.g. http://127.0.0.1:8000)")
    where.add_argument("--server-pid", type=int, help="its process, for RSS (default: the process listening on the port)")
    where.add_argument("--spawn", action="store_true", help="start `wicore serve` on a free loopback port, stop it at the end")
    where.add_argument("--model", default="gemma3-270m", help="--spawn: exported model folder, or gemma3-270m")
    where.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="--spawn: the server's --threads")
    where.add_argument(
        "--serve-args", default="", help="--spawn: more `wicore serve` flags, e.g. --serve-args='--max-num-seqs 32'"
    )
    where.add_argument("--server-log", type=Path, help="--spawn: the server's output (default: a temporary file)")
    where.add_argument("--api-key", help="Bearer key to send (and, with --spawn, the server's --api-key)")
    where.add_argument("--start-timeout", type=float, default=600, help="--spawn: seconds to wait for /health")
    load = parser.add_argument_group("the load")
    load.add_argument("--clients", type=int, default=16, help="concurrent streaming clients")
    load.add_argument("--ramp", type=float, default=10, help="seconds over which the clients start, evenly spread")
    load.add_argument("--duration", type=float, default=60, help="seconds from the start after which no request starts")
    load.add_argument("--max-requests", type=int, help="requests to start in all (default: no limit)")
    load.add_argument("--requests-per-client", type=int, help="requests each client starts at most (default: no limit)")
    load.add_argument("--max-tokens", default="8,64", help="max_tokens of each request: uniform in LO,HI")
    load.add_argument("--disconnect-fraction", type=float, default=0.0, help="share of requests whose stream is dropped")
    load.add_argument(
        "--disconnect-chunks",
        default="1,3",
        help="chunks a dropped stream reads first: uniform in LO,HI (0: only the response headers)",
    )
    load.add_argument("--request-timeout", type=float, default=300, help="seconds one request may take")
    load.add_argument("--seed", type=int, default=0)
    check = parser.add_argument_group("the checks")
    check.add_argument("--drain-timeout", type=float, default=60, help="seconds to wait for /v1/stats to drain")
    check.add_argument("--no-probe", action="store_true", help="skip the greedy completion before and after")
    check.add_argument("--json", type=Path, help="also write a JSON record (every request's figures) here")
    check.add_argument(
        "--sigterm-under-load",
        type=float,
        metavar="SECONDS",
        help="--spawn: after the checks, run the load again and send SIGTERM this many seconds into it",
    )
    check.add_argument("--grace-seconds", type=float, default=30.0, help="--spawn: the server's --grace-seconds")
    args = parser.parse_args(argv)
    return StressConfig(
        url=args.url,
        is_spawn=args.spawn,
        model=args.model,
        threads=args.threads,
        serve_args=tuple(shlex.split(args.serve_args)),
        server_log=args.server_log,
        server_pid=args.server_pid,
        api_key=args.api_key,
        load=Load(
            num_clients=args.clients,
            ramp_s=args.ramp,
            duration_s=args.duration,
            max_requests=args.max_requests,
            max_requests_per_client=args.requests_per_client,
            max_tokens=int_pair(args.max_tokens),
            disconnect_fraction=args.disconnect_fraction,
            disconnect_chunks=int_pair(args.disconnect_chunks),
            request_timeout_s=args.request_timeout,
            seed=args.seed,
        ),
        drain_timeout_s=args.drain_timeout,
        start_timeout_s=args.start_timeout,
        is_probe=not args.no_probe,
        json_path=args.json,
        sigterm_under_load_s=args.sigterm_under_load,
        grace_s=args.grace_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(argv, parse_args, run)


if __name__ == "__main__":
    sys.exit(main())
