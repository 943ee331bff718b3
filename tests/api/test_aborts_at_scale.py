"""1,000 requests through the HTTP API, a third of them abandoned by their clients mid-flight (the
connection closed while the request is queued, prefilling or streaming): every request's blocks
come back, and the ones that ran to their end generated what they would have alone."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "cats",
    "sleep",
    "in",
    "warm",
    "sun",
]
NUM_REQUESTS = 1000
CONCURRENCY = 48


async def one(client: httpx.AsyncClient, url: str, i: int, abandon_after: float | None) -> tuple[int, str | None]:
    body = {
        "model": "tiny-mm",
        "prompt": f"request {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 30)),
        "max_tokens": 8 + i % 24,
        "temperature": 0,
        "stream": i % 2 == 0,
        "ignore_eos": True,
    }
    request = client.post(f"{url}/v1/completions", json=body)
    if abandon_after is None:
        r = await request
        if r.status_code != 200:
            return i, f"status {r.status_code}"
        if not body["stream"]:
            return i, r.json()["choices"][0]["text"]
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return i, "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
    try:
        await asyncio.wait_for(request, abandon_after)  # the client hangs up: its connection closes
    except asyncio.TimeoutError:
        pass
    return i, None


async def run(url: str) -> list[tuple[int, str | None]]:
    rng = random.Random(5)
    plan = [rng.uniform(0.001, 0.3) if rng.random() < 1 / 3 else None for _ in range(NUM_REQUESTS)]
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0)
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def gated(i: int) -> tuple[int, str | None]:
            async with gate:
                return await one(client, url, i, plan[i])

        return await asyncio.gather(*(gated(i) for i in range(NUM_REQUESTS)))


def test_a_thousand_requests_with_random_aborts_leave_no_block_referenced(multimodal_server):
    served = multimodal_server()  # the tiny random Gemma 3 with a tokenizer (its text path)
    results = asyncio.run(run(served.url))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = served.engine.stats()
        if stats.running == stats.waiting == stats.swapped == 0:
            break
        time.sleep(0.05)
    stats = served.engine.stats()
    assert (stats.running, stats.waiting, stats.swapped) == (0, 0, 0)
    assert stats.blocks_referenced.total == 0
    # The abandoned requests were cut short (not run to their max_tokens for nobody).
    asked = sum(8 + i % 24 for i in range(NUM_REQUESTS))
    assert stats.generated_tokens < asked - 2000
    finished = [text for _, text in results if text is not None]
    assert len(finished) > NUM_REQUESTS // 2 and not any(t.startswith("status") for t in finished)
    # Requests that ran to their end are unaffected by the aborted ones around them: the same
    # prompt alone gives the same text.
    i, text = next((i, t) for i, t in results if t is not None and i % 2 == 0)  # a streamed one
    [(_, alone)] = asyncio.run(_alone(served.url, i))
    assert alone == text


async def _alone(url: str, i: int) -> list[tuple[int, str | None]]:
    async with httpx.AsyncClient(timeout=60) as client:
        return [await one(client, url, i, None)]
