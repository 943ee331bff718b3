"""stress.py's clients: the load (a frozen dataclass), the prompts, one streamed request, the client tasks.

    client i:  start at i * ramp / N ─┬─ request ─┬─ request ─┬─ ...   (no new request after duration)

Each request: a prompt from PROMPTS (a few words .. ~800 tokens), chat or completions, stream=True
with the usage chunk, temperature in TEMPERATURES, max_tokens uniform in Load.max_tokens; a
Load.disconnect_fraction of them close the stream after Load.disconnect_chunks chunks. A stream
that ends with the server's shutdown error event (503 server_shutting_down) is the outcome CUT;
after a connection error a client waits a second before its next request.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
from workloads import PARAGRAPH, SENTENCES, SYSTEM_PROMPT

TEMPERATURES = (0.0, 0.7, 1.0)
SHORT_PROMPTS = (
    "Hello!",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three prime numbers.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
)
LONG_PROMPTS = (
    PARAGRAPH + "\n\nSummarise the text above in one sentence.",
    " ".join(SENTENCES) + "\n\nWhich of these sentences mention animals?",
    SYSTEM_PROMPT + "\n\nCustomer: I need a tent for a family of four. What should I look for?",
    "\n\n".join([PARAGRAPH] * 8) + "\n\nHow many times is the paragraph repeated above?",
)
PROMPTS = SHORT_PROMPTS + LONG_PROMPTS
SHUTDOWN_CODE = "server_shutting_down"
CUT = "cut by shutdown (503)"  # the outcome of a stream that ended with the shutdown's error event
CONNECTION_ERRORS = ("APIConnectionError", "APITimeoutError", "ConnectError", "RemoteProtocolError", "ReadError")


@dataclass(frozen=True)
class Load:
    num_clients: int
    ramp_s: float  # the clients start evenly spread over it
    duration_s: float  # from the start; no request starts after it
    max_requests: int | None  # in all
    max_requests_per_client: int | None
    max_tokens: tuple[int, int]  # LO, HI
    disconnect_fraction: float
    disconnect_chunks: tuple[int, int]  # LO, HI chunks a dropped stream reads first (0: the headers only)
    request_timeout_s: float
    seed: int

    def __post_init__(self) -> None:
        if self.num_clients < 1:
            raise ValueError("--clients must be at least 1")
        if not 0 <= self.ramp_s <= self.duration_s:
            raise ValueError("--ramp must be between 0 and --duration")
        if any(n is not None and n < 1 for n in (self.max_requests, self.max_requests_per_client)):
            raise ValueError("--max-requests and --requests-per-client must be at least 1")
        for name, (lo, hi), least in (("--max-tokens", self.max_tokens, 1), ("--disconnect-chunks", self.disconnect_chunks, 0)):
            if not least <= lo <= hi:
                raise ValueError(f"{name} takes LO,HI with {least} <= LO <= HI")
        if not 0 <= self.disconnect_fraction <= 1:
            raise ValueError("--disconnect-fraction must be in [0, 1]")


@dataclass(frozen=True)
class RequestPlan:
    is_chat: bool
    prompt_index: int
    temperature: float
    max_tokens: int
    disconnect_after: int | None  # chunks read before the client closes the stream (0: headers only); None: all


@dataclass(frozen=True)
class RequestResult:
    plan: RequestPlan
    outcome: str  # "ok", "disconnected" or an error kind
    started_s: float  # from the run's start
    ttft_s: float | None
    latency_s: float
    num_tokens: int
    error: str | None = None


def draw_plan(rng: random.Random, load: Load) -> RequestPlan:
    is_drop = rng.random() < load.disconnect_fraction
    return RequestPlan(
        is_chat=rng.random() < 0.5,
        prompt_index=rng.randrange(len(PROMPTS)),
        temperature=rng.choice(TEMPERATURES),
        max_tokens=rng.randint(*load.max_tokens),
        disconnect_after=rng.randint(*load.disconnect_chunks) if is_drop else None,
    )


def chunk_text(chunk: object, is_chat: bool) -> tuple[str, str | None]:
    """(text, finish reason) of one streamed chunk; ("", None) for the usage chunk."""
    choices = getattr(chunk, "choices", None) or []
    if not choices:
        return "", None
    choice = choices[0]
    text = (choice.delta.content or "") if is_chat else (choice.text or "")
    return text, choice.finish_reason


async def send(client: object, model: str, plan: RequestPlan, t0: float) -> RequestResult:
    """One streamed request, as the client sees it."""
    import openai

    started = time.perf_counter()
    ttft = None
    num_chunks = num_text_chunks = 0
    usage_tokens = None
    finish = None
    common = dict(model=model, max_tokens=plan.max_tokens, temperature=plan.temperature, stream=True)
    common.update(stream_options={"include_usage": True})  # the usage chunk counts the tokens

    def result(outcome: str, error: str | None = None) -> RequestResult:
        tokens = usage_tokens if usage_tokens is not None else num_text_chunks
        return RequestResult(plan, outcome, started - t0, ttft, time.perf_counter() - started, tokens, error)

    try:
        if plan.is_chat:
            messages = [{"role": "user", "content": PROMPTS[plan.prompt_index]}]
            stream = await client.chat.completions.create(messages=messages, **common)  # type: ignore[attr-defined]
        else:
            stream = await client.completions.create(prompt=PROMPTS[plan.prompt_index], **common)  # type: ignore[attr-defined]
        async with stream:
            if plan.disconnect_after == 0:  # headers only: the request may still be queued
                return result("disconnected")
            async for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    usage_tokens = chunk.usage.completion_tokens
                text, reason = chunk_text(chunk, plan.is_chat)
                num_chunks += 1
                if text:
                    num_text_chunks += 1
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                finish = reason or finish
                if plan.disconnect_after is not None and num_chunks >= plan.disconnect_after and finish is None:
                    return result("disconnected")  # leaving `async with` closes the connection
    except openai.APIStatusError as exc:
        return result(f"http {exc.status_code}", str(exc)[:300])
    except openai.APIError as exc:
        if getattr(exc, "code", None) == SHUTDOWN_CODE:  # the error event of a stream cut by a shutdown
            return result(CUT, str(exc)[:300])
        return result(type(exc).__name__, str(exc)[:300])
    except (httpx.HTTPError, OSError) as exc:
        return result(type(exc).__name__, str(exc)[:300])
    if finish not in ("stop", "length"):
        return result("no finish reason" if finish is None else f"finish reason {finish}")
    return result("ok")


@dataclass
class Budget:
    """Requests the clients may still start (shared by the asyncio tasks of one thread)."""

    num_left: int | None
    deadline: float

    def take(self) -> bool:
        if time.perf_counter() >= self.deadline or self.num_left == 0:
            return False
        if self.num_left is not None:
            self.num_left -= 1
        return True


async def run_client(index: int, client: object, model: str, load: Load, budget: Budget, t0: float) -> list[RequestResult]:
    rng = random.Random(load.seed * 1_000_003 + index)
    await asyncio.sleep(index * load.ramp_s / load.num_clients)
    results: list[RequestResult] = []
    while (load.max_requests_per_client is None or len(results) < load.max_requests_per_client) and budget.take():
        results.append(await send(client, model, draw_plan(rng, load), t0))
        if results[-1].outcome in CONNECTION_ERRORS:  # the server may be gone: no busy loop of failures
            await asyncio.sleep(1.0)
    return results


async def run_clients(url: str, model: str, load: Load, api_key: str | None) -> tuple[list[RequestResult], float]:
    """Every client's requests, in start order, and the run's wall seconds."""
    import openai

    limits = httpx.Limits(max_connections=load.num_clients + 8, max_keepalive_connections=load.num_clients)
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=api_key or "unused",
        max_retries=0,
        timeout=load.request_timeout_s,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=load.request_timeout_s),
    )
    t0 = time.perf_counter()
    budget = Budget(load.max_requests, t0 + load.duration_s)
    try:
        per_client = await asyncio.gather(*(run_client(i, client, model, load, budget, t0) for i in range(load.num_clients)))
    finally:
        await client.close()
    wall = time.perf_counter() - t0
    return sorted((r for rs in per_client for r in rs), key=lambda r: r.started_s), wall
