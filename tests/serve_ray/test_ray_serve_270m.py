"""`wicore serve --replicas 2 --ingress-replicas 2` on a real local Ray cluster with the real Gemma 3
270M, driven by the openai package: the same greedy text as one `wicore serve`, both engine replicas
used and both ingress replicas up, and a replica killed mid-request fails its requests with a clear
error while Ray replaces it.

One cluster for the module (Ray starts in ~10 s; each replica loads the model in a few). The
machine's cores are shared: 2 replicas x 1 thread on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread, free_port
from wicore.engine.engine import Engine, EngineConfig
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

pytest.importorskip("ray.serve", reason="the Ray Serve tests need the wicore[ray] extra")
pytestmark = pytest.mark.slow

MODEL = "gemma3-270m"
MAX_TOKENS = 12
TOPICS = ["France", "the ocean", "a cat", "Mars", "bread", "music", "winter", "a robot"]
# 16 requests: each topic as a completion and as a chat; every other one streamed.
REQUESTS = [(kind, topic) for topic in TOPICS for kind in ("completion", "chat")]
START_TIMEOUT_S = 240.0
CALL_TIMEOUT_S = 120.0


async def ask(
    client: openai.AsyncOpenAI, kind: str, topic: str, stream: bool, max_tokens: int = MAX_TOKENS, ignore_eos: bool = False
) -> str:
    """The greedy text of one request (streamed deltas joined); `ignore_eos`: it runs to max_tokens."""
    common = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    if ignore_eos:
        common["extra_body"] = {"ignore_eos": True}
    if kind == "chat":
        response = await client.chat.completions.create(
            messages=[{"role": "user", "content": f"Tell me about {topic}."}], **common
        )
    else:
        response = await client.completions.create(prompt=f"Here is a short fact about {topic}:", **common)
    if not stream:
        choice = response.choices[0]
        return choice.message.content if kind == "chat" else choice.text
    text = ""
    async for chunk in response:
        for c in chunk.choices:
            text += (c.delta.content if kind == "chat" else c.text) or ""
    return text


async def ask_all(url: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=CALL_TIMEOUT_S)
    calls = [ask(client, kind, topic, stream=i % 2 == 1) for i, (kind, topic) in enumerate(REQUESTS)]
    return await asyncio.wait_for(asyncio.gather(*calls), CALL_TIMEOUT_S)


@pytest.fixture(scope="module")
def model_dir(gemma_270m) -> Path:
    return gemma_270m(1)


@pytest.fixture(scope="module")
def reference_texts(model_dir: Path) -> list[str]:
    """The 16 answers of one plain `wicore serve` (the same app on one Engine), taken first, so the
    cluster does not share the cores with it."""
    engine = Engine(EngineConfig(model_dir=model_dir, num_threads=2, verify_files=False, kv_pool_gb=0.25)).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name=MODEL, chat_template=GEMMA3_CHAT_TEMPLATE))).start()
    try:
        return asyncio.run(ask_all(server.url))
    finally:
        server.stop()
        engine.stop()


@pytest.fixture(scope="module")
def cluster(model_dir: Path, reference_texts: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`wicore serve --replicas 2 --ingress-replicas 2` in a subprocess (its own local Ray cluster); its URL."""
    port = free_port()
    template = tmp_path_factory.mktemp("template") / "gemma3.jinja"  # the packaged base model chats through it
    template.write_text(GEMMA3_CHAT_TEMPLATE, encoding="utf-8")
    command = [sys.executable, "-m", "wicore.cli", "serve", "--model", str(model_dir), "--port", str(port)]
    command += ["--replicas", "2", "--ingress-replicas", "2", "--threads", "1", "--kv-pool-gb", "0.25", "--host-tier-gb", "0.1"]
    command += ["--served-model-name", MODEL, "--chat-template", str(template)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(replicas(url)) == 2 and len(ingresses(url)) == 2, START_TIMEOUT_S, process)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # the CLI shuts Serve and its Ray cluster down
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ingresses(url: str) -> list[dict]:
    """The ingress replicas on the stats board now (each reads it every second)."""
    return board(url, "ingresses")


def replicas(url: str) -> list[dict]:
    """The engine replicas reporting to the stats board now; none while the server is not up."""
    return board(url, "replicas")


def board(url: str, key: str) -> list[dict]:
    """/v1/stats' list under `key`; none while the server is not up."""
    try:
        response = httpx.get(f"{url}/v1/stats", timeout=5)
    except httpx.TransportError:
        return []
    return response.json()[key] if response.status_code == 200 else []


def wait_for(condition, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"wicore serve exited with {process.returncode}:\n{process.stderr.read()[-4000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            said = ""
            if process is not None:  # what the server said while it did not come up
                process.terminate()
                try:
                    said = ":\n" + process.communicate(timeout=30)[1][-4000:]
                except subprocess.TimeoutExpired:
                    process.kill()
            raise AssertionError(f"not within {timeout:g} s{said}")
        time.sleep(0.25)


def served_by_both(url: str) -> dict | None:
    """A /v1/stats reading where both engine replicas have run a prompt, within 10 s (the replicas
    report every ~2 s, and each ingress answers from its own copy of the board); None if none was."""
    readings: list[dict] = []

    def both() -> bool:
        try:
            readings.append(httpx.get(f"{url}/v1/stats", timeout=5).json())
        except httpx.TransportError:
            return False
        return len(readings[-1]["replicas"]) == 2 and all(r["stats"]["prompt_tokens"] > 0 for r in readings[-1]["replicas"])

    try:
        wait_for(both, 10)
    except AssertionError:
        return None
    return readings[-1]


def test_two_replicas_answer_as_one_server_and_both_serve(cluster: str, reference_texts: list[str]):
    # An ingress's handle may learn of the second replica a little after the replica reports to the
    # board (Ray's long poll), so the first burst can all go to one; a second burst must not.
    for _ in range(2):
        texts = asyncio.run(ask_all(cluster))
        assert texts == reference_texts
        assert all(texts)
        stats = served_by_both(cluster)
        if stats is not None:
            break
    else:
        raise AssertionError(f"one replica served no prompt in two bursts of {len(REQUESTS)}: {replicas(cluster)}")
    per_replica = [r["stats"]["prompt_tokens"] for r in stats["replicas"]]
    assert stats["prompt_tokens"] == sum(per_replica)  # summed over the replicas
    # Every request was taken by one of the two ingresses (which one is Ray's proxy's choice).
    wait_for(lambda: len(ingresses(cluster)) == 2 and sum(i["requests"] for i in ingresses(cluster)) >= len(REQUESTS), 30)
    metrics = httpx.get(f"{cluster}/metrics").text
    assert "wicore_replicas 2.0" in metrics and "wicore_ingresses 2.0" in metrics
    for r in stats["replicas"]:
        assert f'wicore_replica_prompt_tokens{{replica="{r["replica"]}"}}' in metrics


def test_refusals_keep_their_openai_shape_from_the_app_and_from_a_replica(cluster: str):
    """The ingress's own checks (an unknown model) and a replica engine's (a prompt past the
    context) reach the client as one `wicore serve` answers them."""
    wrong = httpx.post(f"{cluster}/v1/completions", json={"model": "other", "prompt": "Hi"}, timeout=30)
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    [card] = httpx.get(f"{cluster}/v1/models", timeout=30).json()["data"]
    too_long = {"model": MODEL, "prompt": [2] * card["max_model_len"], "max_tokens": 1}
    refused = httpx.post(f"{cluster}/v1/completions", json=too_long, timeout=60)
    assert refused.status_code == 400, refused.text
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert refused.json()["error"]["code"] == "context_length_exceeded"


def running(url: str) -> list[int]:
    """Requests running or waiting in each replica's engine (as of their last report, <= ~2 s old)."""
    return [r["stats"]["running"] + r["stats"]["waiting"] for r in replicas(url)]


def test_a_killed_replica_fails_its_requests_clearly_and_is_replaced(cluster: str, reference_texts: list[str]):
    wait_for(lambda: running(cluster) == [0, 0], 30)  # nothing left of the test before

    async def in_flight() -> tuple[list[object], int, int]:
        client = openai.AsyncOpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=CALL_TIMEOUT_S)
        calls = []
        # One at a time, each once the engines report the ones before (long: 200 tokens, none ending
        # early at an end-of-sequence token). Each of the two ingresses routes with its own view of
        # the replicas' queues, so the four need not split two and two.
        for i, topic in enumerate(TOPICS[:4]):
            call = ask(client, "completion", topic, stream=i % 2 == 0, max_tokens=200, ignore_eos=True)
            calls.append(asyncio.ensure_future(call))
            await asyncio.to_thread(wait_for, lambda n=i + 1: sum(running(cluster)) == n, 30)
        # Each ingress serves /v1/stats from its own copy of the board (read every second), so two
        # reads can disagree: the loads are the first reading that has all four.
        readings: list[dict[int, int]] = []

        def all_four() -> bool:
            loads = {r["pid"]: r["stats"]["running"] + r["stats"]["waiting"] for r in replicas(cluster)}
            readings.append(loads)
            return sum(loads.values()) == 4

        await asyncio.to_thread(wait_for, all_four, 30)
        loads = readings[-1]
        victim = max(loads, key=lambda pid: (loads[pid], pid))  # the busier replica
        os.kill(victim, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), CALL_TIMEOUT_S)
        return results, victim, loads[victim]

    started = time.monotonic()
    results, victim, killed = asyncio.run(in_flight())
    assert time.monotonic() - started < CALL_TIMEOUT_S  # no hang
    failures = [r for r in results if isinstance(r, Exception)]
    assert len(failures) == killed, results  # the killed replica's requests; the other replica's finished
    assert all(len(r) > 0 for r in results if isinstance(r, str))
    for failure in failures:
        assert isinstance(failure, openai.APIError), repr(failure)
        assert "engine replica running it died" in failure.message, failure.message
        if isinstance(failure, openai.APIStatusError):  # not streamed: the status says it too
            assert failure.status_code == 503

    # Ray starts a new replica; then both serve again, with the same answers.
    wait_for(lambda: sorted(r["pid"] != victim for r in replicas(cluster)) == [True, True], START_TIMEOUT_S)
    assert asyncio.run(ask_all(cluster)) == reference_texts
