"""What the OpenAI endpoint tests on the real Gemma 3 270M share: waiting for an idle server, joining a
stream, and the shape of an OpenAI error."""

from __future__ import annotations

import time

import httpx

MODEL = "gemma3-270m"
CHAT = [{"role": "user", "content": "Say hello in French"}]


def wait_idle(served, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{served.url}/v1/stats").json()
        if stats["running"] == stats["waiting"] == stats["swapped"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def stream_text(stream) -> tuple[str, str | None, object]:
    text, reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content if hasattr(choice, "delta") else choice.text) or ""
            reason = choice.finish_reason or reason
    return text, reason, usage


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    return error
