"""Prometheus metrics of one app, in its own registry (never prometheus_client's global one).

Request counters and latency histograms are recorded as requests end; engine gauges
(running / waiting, KV blocks per tier, prefix hit rate) are read from engine.stats_json()
when /metrics is scraped; served by several engine replicas (wicore.serve_ray), the stats also
carry each replica's, shown as gauges with a `replica` label. `StatusCounter` (middleware) counts HTTP responses by route and
status; /v1/ws counts each of its requests itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Literal, TypedDict, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wicore.api.generation import ChoiceStats

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("wicore_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.prompt_tokens = Counter("wicore_prompt_tokens", "Prompt tokens of finished choices", registry=r)
        self.generated_tokens = Counter("wicore_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("wicore_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY, registry=r)
        self.itl = Histogram("wicore_inter_token_seconds", "Time between tokens", buckets=_LATENCY, registry=r)
        self.e2e = Histogram("wicore_e2e_request_seconds", "Time from arrival to the last token", buckets=_LATENCY, registry=r)
        self.running = Gauge("wicore_requests_running", "Requests running in the engine", registry=r)
        self.waiting = Gauge("wicore_requests_waiting", "Requests waiting in the engine", registry=r)
        self.swapped = Gauge("wicore_requests_swapped", "Requests swapped out to HOST/NVME", registry=r)
        self.blocks_used = Gauge("wicore_kv_blocks_used", "KV blocks in use (owned or cached) per tier", ["tier"], registry=r)
        self.blocks_free = Gauge("wicore_kv_blocks_free", "Free KV blocks per tier", ["tier"], registry=r)
        self.prefix_hit_rate = Gauge("wicore_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache", registry=r)
        # Speculative decoding, with vLLM's names and types: counters of the engine's totals.
        self.spec = SpecDecodeCounters()
        r.register(self.spec)
        self.spec_rate = Gauge("wicore_spec_decode_acceptance_rate", "Accepted share of the draft tokens", registry=r)
        self.replicas = Gauge("wicore_replicas", "Engine replicas reporting (several behind Ray Serve)", registry=r)
        self.ingresses = Gauge("wicore_ingresses", "Ingress replicas alive (Ray Serve)", registry=r)
        self.ingress_requests = Gauge(
            "wicore_ingress_requests",
            "Requests one ingress replica has taken since it started (Ray Serve)",
            ["ingress"],
            registry=r,
        )
        self.per_replica = {
            key: Gauge(f"wicore_replica_{name}", text, ["replica"], registry=r)
            for key, name, text in (
                ("running", "requests_running", "Requests running in one replica's engine"),
                ("waiting", "requests_waiting", "Requests waiting in one replica's engine"),
                ("prompt_tokens", "prompt_tokens", "Prompt tokens one replica's engine admitted since it started"),
                ("generated_tokens", "generated_tokens", "Tokens one replica's engine generated since it started"),
                ("prefix_hit_rate", "prefix_cache_hit_rate", "Prompt tokens one replica found in its prefix cache"),
            )
        }

    def observe_request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def observe_choice(self, stats: ChoiceStats, ended: float) -> None:
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        self.generated_tokens.inc(stats.num_completion_tokens)
        times = stats.token_times
        if times:
            self.ttft.observe(times[0] - stats.started)
            for a, b in itertools.pairwise(times):
                self.itl.observe(b - a)
        self.e2e.observe(ended - stats.started)

    def render(self, engine_stats: dict[str, object]) -> bytes:
        for gauge, key in ((self.running, "running"), (self.waiting, "waiting"), (self.swapped, "swapped")):
            gauge.set(float(engine_stats[key]))  # type: ignore[arg-type]
        for per_tier, key in ((self.blocks_used, "blocks_in_use"), (self.blocks_free, "blocks_free")):
            for tier, n in dict(engine_stats[key]).items():  # type: ignore[call-overload]
                per_tier.labels(tier=tier).set(n)
        self.prefix_hit_rate.set(float(engine_stats["prefix_hit_rate"]))  # type: ignore[arg-type]
        replicas = engine_stats.get("replicas")
        self.replicas.set(len(replicas) if isinstance(replicas, list) else 1)  # one engine: this process's
        if isinstance(replicas, list):
            for key, gauge in self.per_replica.items():
                gauge.clear()  # a replica that went away goes from /metrics too
                for report in replicas:
                    gauge.labels(replica=report["replica"]).set(float(report["stats"][key]))
        ingresses = engine_stats.get("ingresses")
        if isinstance(ingresses, list):  # behind Ray Serve: a scrape reaches one ingress; the board knows all
            self.ingresses.set(len(ingresses))
            self.ingress_requests.clear()
            for ingress in ingresses:
                self.ingress_requests.labels(ingress=ingress["ingress"]).set(float(ingress["requests"]))
        spec = engine_stats.get("speculative")
        if isinstance(spec, dict):
            self.spec.totals = cast(SpecTotals, spec)  # engine.stats_json()'s JSON: SpeculativeStats.as_dict
            self.spec_rate.set(float(spec["acceptance_rate"]))
        return generate_latest(self.registry)


class SpecTotals(TypedDict):
    """What SpecDecodeCounters reads of engine.stats_json()["speculative"] (SpeculativeStats.as_dict)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    accepted_per_position: list[int]


class SpecDecodeCounters(Collector):
    """vLLM's speculative-decoding counters (`vllm:spec_decode_num_drafts_total`, ...), their values
    the engine's running totals as of the last scrape (`totals`: engine.stats_json()["speculative"])."""

    NAMES: tuple[tuple[Literal["num_drafts", "num_draft_tokens", "num_accepted_tokens"], str], ...] = (
        ("num_drafts", "Verification rows run (decodes that carried draft tokens)"),
        ("num_draft_tokens", "Draft tokens proposed and verified"),
        ("num_accepted_tokens", "Draft tokens accepted"),
    )

    def __init__(self) -> None:
        self.totals: SpecTotals | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        if self.totals is None:
            return
        for key, help_text in self.NAMES:
            yield CounterMetricFamily(f"vllm:spec_decode_{key}", help_text, value=float(self.totals[key]))
        per_position = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each draft position", labels=["position"]
        )
        for position, n in enumerate(self.totals["accepted_per_position"]):
            per_position.add_metric([str(position)], float(n))
        yield per_position


class StatusCounter:
    """Counts every response by route and status into the app's metrics. Paths that are not a
    route count as "other": a label per raw path would let anyone grow /metrics without bound."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            path = scope.get("path", "")
            self.metrics.observe_request(path if path in self.routes else "other", status)
