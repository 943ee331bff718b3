"""`wicore serve --engine-process on`: the engine in a child process (wicore.engine_process), through a
real server on a real port, against the engine in the server's own process (tests/api/served_app.py).

The model: the tiny chat model (a random Gemma 3 with a byte-level tokenizer, tests/tiny_chat.py) with
a 4,096-token context, so a request for 4,000 tokens runs long enough to be cut.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from served_app import Served, launch, start

from wicore.api.app import ServerSettings
from wicore.cli.main import wants_engine_process

NAME = "tiny"
LONG = 4000


@pytest.fixture(scope="module")
def apart(tiny_chat_long: Path) -> Iterator[str]:
    """The URL of `wicore serve --engine-process on` for the model."""
    proc, url = launch(tiny_chat_long, "--engine-process", "on", "--served-model-name", NAME)
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def inside(tiny_chat_long: Path) -> Iterator[Served]:
    """The same model served with the engine in the server's process."""
    served = start(tiny_chat_long, ServerSettings(model_name=NAME))
    yield served
    served.server.stop()
    served.engine.stop()


def complete(url: str, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": NAME, **body}, timeout=60)


def stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/stats", timeout=10).json()


def test_greedy_text_is_the_in_process_servers(apart: str, inside: Served) -> None:
    body = {"prompt": "What is the weather in Paris", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    ours, theirs = complete(apart, **body).json(), complete(inside.url, **body).json()
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"] == "length"
    assert ours["usage"] == theirs["usage"]
    assert ours["usage"]["completion_tokens"] == 24


def test_seeded_choices_with_logprobs_and_stops_are_the_in_process_servers(apart: str, inside: Served) -> None:
    """Logprobs and sampled tokens cross the process boundary as they are (two seeded choices, a stop string)."""
    body = {"prompt": "hello", "max_tokens": 12, "temperature": 0.9, "seed": 7, "n": 2, "logprobs": 2, "stop": ["e"]}
    ours, theirs = complete(apart, **body).json(), complete(inside.url, **body).json()
    assert ours["choices"] == theirs["choices"]
    assert ours["usage"] == theirs["usage"]
    assert ours["usage"]["completion_tokens"] > 2 and all(c["logprobs"]["top_logprobs"] for c in ours["choices"])


def test_streamed_text_is_the_whole_answer(apart: str) -> None:
    body = {"prompt": "hello world", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    whole = complete(apart, **body).json()["choices"][0]["text"]
    with httpx.stream("POST", f"{apart}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_client_that_leaves_frees_its_request(apart: str) -> None:
    before = stats(apart)["generated_tokens"]
    body = {"prompt": "hello world", "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{apart}/v1/completions", json=body, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))  # it runs: then the client hangs up
    for _ in range(500):  # the abort reaches the child within a few steps
        now = stats(apart)
        if now["running"] == now["waiting"] == 0:
            break
        httpx.get(f"{apart}/health")  # a round trip between reads, not a sleep
    assert now["running"] == now["waiting"] == 0
    assert 0 < now["generated_tokens"] - before < LONG  # ended by the abort, not by its length


def refusal(url: str, **body: object) -> tuple[int, dict]:
    r = complete(url, **body)
    return r.status_code, r.json()


def test_refusals_are_the_in_process_servers(apart: str, inside: Served) -> None:
    too_long = {"prompt": [7] * 5000, "max_tokens": 4}  # past the model's 4,096 tokens
    status, body = refusal(apart, **too_long)
    assert (status, body) == refusal(inside.url, **too_long)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert refusal(apart, **too_long, stream=True) == (status, body)  # checked before the stream starts
    bad_ids = {"prompt": [1, 512], "max_tokens": 4}  # id 512 is past the vocabulary
    assert refusal(apart, **bad_ids) == refusal(inside.url, **bad_ids)
    assert refusal(apart, **bad_ids)[0] == 400


def test_a_schema_the_child_refuses_is_the_same_400(apart: str, inside: Served) -> None:
    """A constraint compiles in the child, on arrival: its refusal comes back through the outputs."""
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}}
    body = {"prompt": "{", "max_tokens": 8, "response_format": schema}
    status, ours = refusal(apart, **body)
    assert (status, ours) == refusal(inside.url, **body)
    assert status == 400 and ours["error"]["code"] == "invalid_schema"


def test_stats_and_metrics_answer(apart: str, inside: Served) -> None:
    ours = stats(apart)
    assert set(ours) == set(stats(inside.url))
    assert ours["running"] == ours["waiting"] == ours["swapped"] == 0
    metrics = httpx.get(f"{apart}/metrics", timeout=10).text
    free = re.search(r'^wicore_kv_blocks_free\{tier="device"\} (\d+)', metrics, re.M)  # from the child's stats
    assert free is not None and int(free.group(1)) == ours["blocks_free"]["device"] > 0


def test_auto_is_on_for_cuda_devices() -> None:
    assert wants_engine_process("auto", "cuda:0") is True
    assert wants_engine_process("auto", "cpu") is False
    assert wants_engine_process("on", "cpu") is True
    assert wants_engine_process("off", "cuda:0") is False


def serve_apart(model: Path) -> tuple[subprocess.Popen, int, int]:
    """`wicore serve --engine-process on` in a session of its own (a process group, as a terminal's):
    (the server, its port, its engine process's pid), once it listens."""
    from wicore.api.server import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wicore.cli", "serve", "--model", str(model), "--port", str(port), "--threads", "2",
         "--engine-process", "on"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Running on" in line:
            break
    found = re.search(r"engine process (\d+) ready", "".join(lines))
    assert found, "".join(lines)
    return proc, port, int(found.group(1))


@pytest.mark.slow
def test_ctrl_c_drains_a_stream_then_stops_the_engine_process(tiny_chat_long: Path) -> None:
    """Ctrl-C reaches the whole process group: the child ignores it and steps on until the drain ends."""
    proc, port, child = serve_apart(tiny_chat_long)
    body = {"prompt": "hello", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        os.killpg(proc.pid, signal.SIGINT)
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    assert proc.wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # gone (the server waited for it)


@pytest.mark.slow
def test_the_server_ends_when_the_engine_process_dies(tiny_chat_long: Path) -> None:
    proc, port, child = serve_apart(tiny_chat_long)
    assert proc.stdout is not None
    body = {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # running when the child dies
        os.kill(child, signal.SIGKILL)
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "engine_died"
    assert proc.wait(timeout=60) == 1
    rest = proc.stdout.read().splitlines()
    told = [line for line in rest if line.startswith("wicore: error:")]
    assert told == [f"wicore: error: the engine process (pid {child}) was killed by SIGKILL; the server stops"]
