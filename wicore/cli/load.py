"""An HTTP load against any OpenAI-compatible completions endpoint, as `vllm bench serve` makes
one: `num_prompts` streamed requests, at most `concurrency` in flight, each a prompt of random
token ids that generates exactly `output_len` tokens (ignore_eos).

Per request, from the moment it is sent:

    sent ── TTFT ──► first chunk ── ITL ──► chunk ── ITL ──► ... ──► last chunk
                     └──────────── TPOT = (latency - TTFT) / (output tokens - 1) ─┘

ITL (inter-token latency) is each gap between two streamed chunks of text; TPOT (time per output token)
is one number a request. Both say how fast tokens arrive once they flow; TTFT says how long a
request waits for its first.
"""

from __future__ import annotations

import asyncio
import json
import queue as queue_module
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wicore.errors import UsageError


@dataclass(frozen=True)
class LoadConfig:
    base_url: str  # http://host:port, with or without /v1
    model: str
    num_prompts: int
    input_len: int
    output_len: int
    vocab_size: int = 32000  # prompt token ids are drawn below this
    min_token_id: int = 0  # ... and from this up (past a tokenizer's special tokens)
    api_key: str | None = None
    seed: int = 0
    timeout: float = 600.0  # seconds one request may take

    def __post_init__(self) -> None:
        for name in ("num_prompts", "input_len", "output_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.min_token_id < self.vocab_size:
            raise UsageError(f"min_token_id must be in [0, vocab_size), got {self.min_token_id}")

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        return f"{base.removesuffix('/v1')}/v1/completions"


@dataclass
class RequestTiming:
    """One streamed request: when it was sent, when each chunk of tokens came, how many tokens."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    num_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def latency(self) -> float:
        return self.chunk_times[-1] - self.sent

    @property
    def tpot(self) -> float | None:
        """None where the tokens after the first were not seen arrive: one token, or all of them in one
        chunk of text (a tokenizer may hold back text until a character completes)."""
        if self.num_tokens < 2 or len(self.chunk_times) < 2:
            return None
        return (self.latency - self.ttft) / (self.num_tokens - 1)


@dataclass(frozen=True)
class Spread:
    """Mean, median and 99th percentile of a sample, in milliseconds."""

    mean: float
    p50: float
    p99: float

    @staticmethod
    def of(seconds: list[float]) -> Spread | None:
        if not seconds:
            return None
        ms = np.asarray(seconds) * 1e3
        return Spread(float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))


@dataclass(frozen=True)
class LevelResult:
    """The load at one concurrency."""

    concurrency: int
    num_completed: int
    num_failed: int
    duration: float  # seconds, first request sent to last token
    num_output_tokens: int
    ttft: Spread | None
    tpot: Spread | None
    itl: Spread | None
    first_error: str | None = None

    @property
    def requests_per_second(self) -> float:
        return self.num_completed / self.duration if self.duration > 0 else 0.0

    @property
    def output_tokens_per_second(self) -> float:
        return self.num_output_tokens / self.duration if self.duration > 0 else 0.0


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int, low: int = 0) -> list[list[int]]:
    """`num_prompts` prompts of `input_len` token ids drawn uniformly from [low, vocab_size)."""
    rng = np.random.default_rng(seed)
    return rng.integers(low, vocab_size, size=(num_prompts, input_len)).tolist()


def summarize(concurrency: int, timings: list[RequestTiming], duration: float) -> LevelResult:
    done = [t for t in timings if t.error is None and t.chunk_times]
    failed = [t for t in timings if t not in done]
    gaps = [b - a for t in done for a, b in zip(t.chunk_times, t.chunk_times[1:])]
    return LevelResult(
        concurrency=concurrency,
        num_completed=len(done),
        num_failed=len(failed),
        duration=duration,
        num_output_tokens=sum(t.num_tokens for t in done),
        ttft=Spread.of([t.ttft for t in done]),
        tpot=Spread.of([tpot for t in done if (tpot := t.tpot) is not None]),
        itl=Spread.of(gaps),
        first_error=next((t.error or "no token streamed" for t in failed), None),
    )


async def run_level(config: LoadConfig, concurrency: int) -> LevelResult:
    """`config.num_prompts` requests, `concurrency` at a time (a closed loop: each finished
    request lets the next one go, as `vllm bench serve --max-concurrency` with no request rate)."""
    prompts = random_prompts(config.num_prompts, config.input_len, config.vocab_size, config.seed, config.min_token_id)
    start = time.perf_counter()
    timings = await run_prompts(config, prompts, concurrency)
    return summarize(concurrency, timings, _end(timings, start) - start)


async def run_prompts(config: LoadConfig, prompts: list[list[int]], concurrency: int) -> list[RequestTiming]:
    """Send `prompts`, `concurrency` at a time, each as soon as a slot frees: their timings."""
    import httpx

    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    timings: list[RequestTiming] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=config.timeout, headers=_headers(config)) as client:

        async def worker() -> None:
            while not queue.empty():
                timings.append(await one_request(client, config, queue.get_nowait()))

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return timings


def run_level_in_processes(config: LoadConfig, concurrency: int, processes: int) -> LevelResult:
    """`run_level` with the load spread over `processes` client processes (at most one a request in
    flight): one Python process parsing streamed chunks tops out near one core's worth of tokens a
    second, which a fast server or several engines behind one endpoint pass. Process k sends prompts
    k, k + processes, ... with its share of the concurrency; all start together (a barrier), and
    each reports its timings from that start, so no clock is compared across processes."""
    import multiprocessing

    prompts = random_prompts(config.num_prompts, config.input_len, config.vocab_size, config.seed, config.min_token_id)
    n = min(processes, concurrency, len(prompts))
    if n <= 1:
        return asyncio.run(run_level(config, concurrency))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    workers = [
        ctx.Process(target=_share, args=(config, prompts[k::n], concurrency // n + (k < concurrency % n), barrier, results))
        for k in range(n)
    ]
    for w in workers:
        w.start()
    shares: list[list[RequestTiming] | str] = []
    while len(shares) < n:  # before join: a full pipe would block a worker's exit
        try:
            shares.append(results.get(timeout=1.0))
        except queue_module.Empty:
            if not any(w.is_alive() for w in workers) and results.empty():
                shares.append("a client process ended without its results")
    for w in workers:
        w.join()
    timings: list[RequestTiming] = []
    for share in shares:
        if isinstance(share, str):
            raise UsageError(share)
        timings += share
    return summarize(concurrency, timings, _end(timings, 0.0))


def _share(config: LoadConfig, prompts: list[list[int]], concurrency: int, barrier, results) -> None:
    """One client process of `run_level_in_processes`: its timings from the common start, or the
    error that stopped it."""
    try:
        barrier.wait()
        start = time.perf_counter()
        timings = asyncio.run(run_prompts(config, prompts, concurrency))
        for t in timings:
            t.sent -= start
            t.chunk_times = [c - start for c in t.chunk_times]
        results.put(timings)
    except Exception as exc:  # the parent raises it as the benchmark's one-line error
        results.put(str(exc) if isinstance(exc, UsageError) else f"a client process failed: {type(exc).__name__}: {exc}")


def _end(timings: list[RequestTiming], start: float) -> float:
    """When the last token of `timings` came (`start` if none did)."""
    return max((t.chunk_times[-1] for t in timings if t.chunk_times), default=start)


async def one_request(client, config: LoadConfig, prompt: list[int]) -> RequestTiming:  # client: httpx.AsyncClient
    """Send one streamed completion and time its chunks; a failure is recorded, not raised."""
    import httpx

    body = {
        "model": config.model,
        "prompt": prompt,
        "max_tokens": config.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timing = RequestTiming(time.perf_counter())
    usage_tokens = None
    try:
        async with client.stream("POST", config.url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                timing.error = f"HTTP {response.status_code}: {text[:200]}"
                return timing
            async for line in sse_lines(response):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
                choices = event.get("choices") or []
                if choices and (choices[0].get("text") or (choices[0].get("finish_reason") and not timing.chunk_times)):
                    # a chunk of text; or the end of a request whose tokens all decoded to no text (a
                    # model repeating a special token): its first "token" arrives with the end
                    timing.chunk_times.append(time.perf_counter())
    except httpx.ConnectError as exc:  # no server there: the whole benchmark stops
        raise UsageError(f"cannot reach {config.url}: {exc}") from exc
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
        return timing
    timing.num_tokens = usage_tokens if usage_tokens is not None else len(timing.chunk_times)
    return timing


async def sse_lines(response: Any) -> AsyncIterator[str]:
    """The lines of an event stream, split at "\n" (and "\r\n") alone, as SSE splits them. httpx's
    `aiter_lines` also splits at U+0085, U+2028 and U+2029, which JSON leaves unescaped in a token's
    text: a chunk holding one came apart and failed as JSON (a few requests in a thousand of random
    tokens, 2026-11-29)."""
    pending = ""
    async for text in response.aiter_text():
        *lines, pending = (pending + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if pending:
        yield pending


def check_endpoint(config: LoadConfig) -> None:
    """One short request before the load: a server that is not there, or refuses, is one clear error."""
    import httpx

    async def probe() -> RequestTiming:
        async with httpx.AsyncClient(timeout=config.timeout, headers=_headers(config)) as client:
            return await one_request(client, config, [config.min_token_id] * min(config.input_len, 8))

    timing = asyncio.run(probe())
    if timing.error is not None:
        raise UsageError(f"{config.url}: the first request failed: {timing.error}")


def model_name(base_url: str, api_key: str | None) -> str:
    """The first model id the endpoint's /v1/models lists."""
    import httpx

    url = f"{base_url.rstrip('/').removesuffix('/v1')}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise UsageError(f"cannot reach {url}: {exc}") from exc
    if response.status_code != 200:
        raise UsageError(f"{url}: HTTP {response.status_code}; give the model with --served-model-name")
    data = response.json().get("data") or []
    if not data:
        raise UsageError(f"{url} lists no model; give one with --served-model-name")
    return str(data[0]["id"])


def _headers(config: LoadConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
