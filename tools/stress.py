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
The clients live in stress_clients.py, the server side (spawn, RSS, stats) in stress_server.py.

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
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from benchlib import percentile, run_tool, write_record
from stress_clients import CUT, Load, RequestResult, run_clients
from stress_server import (
    RssSampler,
    ServerApi,
    Spawned,
    StatsSampler,
    listening_pid,
    server_error_lines,
    spawn_server,
    tiers_full_at,
)

PROBE_PROMPT = "The three primary colours are"
PROBE_TOKENS = 32
MIB = 1024 * 1024


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


# --------------------------------------------------------------------------- report


@dataclass
class Shutdown:
    """The second run of the load, cut by SIGTERM (--sigterm-under-load)."""

    results: list[RequestResult]
    sigterm_s: float  # from the second run's start
    exit_code: int | None
    exit_s: float | None  # from SIGTERM to the process's exit
    grace_s: float

    def outcomes(self) -> dict[str, int]:
        return dict(sorted(Counter(r.outcome for r in self.results).items()))

    def checks(self) -> dict[str, bool]:
        return {
            "under SIGTERM every stream ended: finished, dropped on purpose, or cut with its 503 event": set(self.outcomes())
            <= {"ok", "disconnected", CUT},
            f"exit 0 within the grace ({self.grace_s:g} s + 10 s) after SIGTERM": self.exit_code == 0
            and self.exit_s is not None
            and self.exit_s <= self.grace_s + 10,
        }


@dataclass
class Report:
    results: list[RequestResult]
    wall_s: float
    stats_before: dict  # after the first probe, before the clients
    stats_drained: dict | None  # once the clients' requests drained (None: the server went away)
    stats_final: dict | None  # after the second probe too: what the checks read
    drain_s: float
    rss: list[tuple[float, int]]
    probe: tuple[str, str] | None  # greedy text before and after
    server: dict = field(default_factory=dict)  # pid, url, spawned, exit code, log, error lines, gone
    stats_series: list = field(default_factory=list)  # StatsSampler.samples
    shutdown: Shutdown | None = None

    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    def errors(self) -> dict[str, int]:
        return {k: n for k, n in sorted(self.outcomes().items()) if k not in ("ok", "disconnected")}

    def checks(self) -> dict[str, bool]:
        final = self.stats_final
        checks = {"the server answered to the end": not self.server.get("gone"), "no unexpected errors": not self.errors()}
        checks["drained: 0 running, 0 waiting"] = final is not None and final["running"] == 0 and final["waiting"] == 0
        checks["0 referenced blocks in every tier"] = final is not None and not any(final["blocks_referenced"].values())
        if self.probe is not None:
            checks["same greedy text before and after"] = self.probe[0] == self.probe[1]
        if self.shutdown is not None:
            checks.update(self.shutdown.checks())
        elif self.server.get("spawned"):
            checks["spawned server exited 0 on SIGTERM"] = self.server.get("exit_code") == 0
        return checks

    def rss_at(self, t: float | None) -> int | None:
        """The first RSS sample at or after `t` seconds (the samplers start together, near enough)."""
        if t is None:
            return None
        return next((b for s, b in self.rss if s >= t), None)

    def figures(self) -> dict[str, object]:
        ok = [r for r in self.results if r.outcome == "ok"]
        ttfts = [r.ttft_s for r in self.results if r.ttft_s is not None and r.outcome in ("ok", "disconnected")]
        latencies = [r.latency_s for r in ok]
        num_tokens = sum(r.num_tokens for r in self.results)
        span = max((r.started_s + r.latency_s for r in self.results), default=0.0) - min(
            (r.started_s for r in self.results), default=0.0
        )
        drained = self.stats_drained
        server_tokens = None if drained is None else drained["generated_tokens"] - self.stats_before["generated_tokens"]
        rss = [b for _, b in self.rss]
        full_s = tiers_full_at(self.stats_series)
        rss_full = self.rss_at(full_s)
        return {
            "num_requests": len(self.results),
            "outcomes": dict(sorted(self.outcomes().items())),
            "num_planned_disconnects": sum(r.plan.disconnect_after is not None for r in self.results),
            "errors": self.errors(),
            "error_samples": {k: next(r.error for r in self.results if r.outcome == k) for k in self.errors()},
            **{f"ttft_p{q}_s": finite(percentile(ttfts, q)) for q in (50, 90, 99)},
            **{f"latency_p{q}_s": finite(percentile(latencies, q)) for q in (50, 90, 99)},
            "num_client_tokens": num_tokens,
            "num_server_tokens": server_tokens,
            "client_tokens_per_s": num_tokens / span if span > 0 else 0.0,
            "server_tokens_per_s": (server_tokens or 0) / span if span > 0 else 0.0,
            "wall_s": self.wall_s,
            "rss_start_bytes": rss[0] if rss else None,
            "rss_peak_bytes": max(rss) if rss else None,
            "rss_end_bytes": rss[-1] if rss else None,
            "tiers_90pct_full_s": full_s,  # every tier that has blocks at least 90% in use
            "rss_at_tiers_full_bytes": rss_full,
            "rss_growth_after_tiers_full_bytes": None if rss_full is None or not rss else rss[-1] - rss_full,
        }


def finite(value: float) -> float | None:
    """None for NaN (the percentile of no values), which JSON cannot hold."""
    return None if math.isnan(value) else value


def seconds(value: object) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def table(report: Report) -> str:
    f = report.figures()
    final = report.stats_final or {"running": "?", "waiting": "?", "swapped": "?", "blocks_referenced": {}}
    outcomes = ", ".join(f"{k} {n}" for k, n in f["outcomes"].items())  # type: ignore[attr-defined]
    rss = (
        "n/a"
        if f["rss_start_bytes"] is None
        else f"start {f['rss_start_bytes'] / MIB:.0f}, peak {f['rss_peak_bytes'] / MIB:.0f}, end {f['rss_end_bytes'] / MIB:.0f} MiB "
        f"({len(report.rss)} samples)"
    )
    referenced = ", ".join(f"{tier} {n}" for tier, n in final["blocks_referenced"].items()) or "?"
    if f["tiers_90pct_full_s"] is not None and f["rss_at_tiers_full_bytes"] is not None:
        rss += (
            f"; every tier 90% full at {f['tiers_90pct_full_s']:.0f} s, RSS then {f['rss_at_tiers_full_bytes'] / MIB:.0f} MiB, "
            f"{f['rss_growth_after_tiers_full_bytes'] / MIB:+.1f} MiB after"
        )
    rows = [
        ("requests", f"{f['num_requests']} ({outcomes}); {f['num_planned_disconnects']} planned drops"),
        ("errors", ", ".join(f"{k}: {n}" for k, n in f["errors"].items()) or "none"),  # type: ignore[attr-defined]
        ("TTFT p50 / p90 / p99", " / ".join(seconds(f[f"ttft_p{q}_s"]) for q in (50, 90, 99)) + " s"),
        ("latency p50 / p90 / p99", " / ".join(seconds(f[f"latency_p{q}_s"]) for q in (50, 90, 99)) + " s"),
        (
            "generated tok/s",
            f"{f['client_tokens_per_s']:.1f} received ({f['num_client_tokens']} tokens), "
            f"{f['server_tokens_per_s']:.1f} computed by the server ({f['num_server_tokens']})",
        ),
        ("wall", f"{f['wall_s']:.1f} s"),
        ("server RSS", rss),
        (
            "final /v1/stats",
            f"running {final['running']}, waiting {final['waiting']}, swapped {final['swapped']}; "
            f"blocks_referenced {referenced} (after {report.drain_s:.1f} s)",
        ),
    ]
    if report.probe is not None:
        rows.append(("greedy probe", "same text" if report.probe[0] == report.probe[1] else f"CHANGED: {report.probe!r}"))
    if report.server.get("gone"):
        rows.append(("server", f"WENT AWAY: {report.server['gone']}"))
    if report.shutdown is not None:
        down = report.shutdown
        ended = ", ".join(f"{k} {n}" for k, n in down.outcomes().items())
        exited = "did not exit" if down.exit_s is None else f"exit {down.exit_code} {down.exit_s:.1f} s after SIGTERM"
        rows.append(("SIGTERM under load", f"at {down.sigterm_s:.0f} s: {len(down.results)} requests ({ended}); {exited}"))
    for name, ok in report.checks().items():
        rows.append(("check", f"{'pass' if ok else 'FAIL'}: {name}"))
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


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
