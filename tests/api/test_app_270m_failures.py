"""The OpenAI endpoints on the real Gemma 3 270M when the engine fails, and priority in the queue."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from app_checks import MODEL, assert_openai_error, wait_idle

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE  # the packaged base model chats through it (--chat-template)
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow


class FailingEngine:
    """The real engine through its public interface, except that a request for the prompt
    `poison_ids`, once `fail` is set, ends at its next output the way the engine ends a request
    that failed inside it (a row whose sampling raised): finish reason "error" and the traceback.

    The engine-level half (ModelRunner.execute puts such a row in `failed`; the scheduler ends it
    with "error") belongs to the runtime tests; this checks what the API makes of that output."""

    def __init__(self, engine: Engine, poison_ids: list[int]) -> None:
        self.engine = engine
        self.poison_ids = poison_ids
        self.fail = threading.Event()
        self.poisoned: set[str] = set()

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    def add_request(
        self,
        prompt: list[int],
        params: SamplingParams,
        priority: str = "normal",
        deadline: float | None = None,
        request_id: str | None = None,
        images: tuple = (),
    ) -> str:
        request_id = self.engine.add_request(prompt, params, priority, deadline, request_id, images)
        if prompt == self.poison_ids:
            self.poisoned.add(request_id)
        return request_id

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        async for out in self.engine.outputs(request_id):
            if request_id in self.poisoned and self.fail.is_set() and not out.finished:
                self.engine.abort(request_id)  # its blocks go back, as a failed request's do
                error = "Traceback ...\nRuntimeError: this request's sampler failed"
                yield RequestOutput(request_id, [], finished=True, finish_reason="error", error=error)
                return
            yield out


@pytest.fixture
def failing(gemma_server):
    """(the engine wrapper, the URL of the real app in front of it): a second server on the same engine."""
    engine = FailingEngine(gemma_server.engine, gemma_server.engine.tokenizer.encode("Once upon a time"))
    server = ServerThread(create_app(engine, ServerSettings(model_name=MODEL, chat_template=GEMMA3_CHAT_TEMPLATE))).start()  # type: ignore[arg-type]
    yield engine, server.url
    server.stop()


def test_a_request_failing_mid_stream_ends_with_an_error_event_and_the_others_go_on(failing, gemma_server):
    engine, url = failing
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    prompts = [f"Count from {i} to {i + 5}:" for i in range(2)]
    expected = [api.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text for p in prompts]
    results: list[str | None] = [None] * len(prompts)
    started = threading.Barrier(len(prompts) + 1)

    def run(i: int) -> None:
        text = ""
        for n, chunk in enumerate(
            api.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24, temperature=0, stream=True)
        ):
            text += chunk.choices[0].text
            if n == 0:
                started.wait(timeout=60)
        results[i] = text

    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0, "stream": True}
    events: list[dict] = []
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                break
        for t in threads:
            t.start()
        started.wait(timeout=60)  # the other streams are running too
        engine.fail.set()  # the poisoned request's next output is the engine's "error"
        rest = [line for line in lines if line.startswith("data: ")]
    for t in threads:
        t.join(timeout=300)
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["code"] == "internal_error" and events[0]["id"] in error["message"]
    assert "sampler failed" not in error["message"]  # the traceback goes to the log, not the client
    assert all("choices" in json.loads(line[6:]) for line in rest[:-2])
    assert results == expected  # the concurrent streams completed, unchanged
    stats = wait_idle(gemma_server)
    assert stats["running"] == 0 and stats["blocks_referenced"]["device"] == 0
    again = api.completions.create(model=MODEL, prompt=prompts[0], max_tokens=24, temperature=0)
    assert again.choices[0].text == expected[0]  # the server goes on serving


def test_a_request_failing_in_the_engine_is_500_internal_error(failing, gemma_server):
    engine, url = failing
    engine.fail.set()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    error = assert_openai_error(r, 500)
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "failed inside the engine" in error["message"] and "sampler failed" not in error["message"]
    stats = wait_idle(gemma_server)
    assert stats["running"] == 0 and stats["blocks_referenced"]["device"] == 0
    ok = httpx.post(f"{url}/v1/completions", json={**body, "prompt": "Hello", "max_tokens": 3}, timeout=120)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_priority_from_the_api_orders_queued_requests(gemma_270m):
    # One sequence at a time, no aging: the engine starts only once all five requests wait.
    engine = Engine(
        EngineConfig(
            model_dir=gemma_270m(1),
            num_threads=2,
            verify_files=False,
            num_device_blocks=32,
            scheduler=SchedulerConfig(max_num_seqs=1, aging_seconds=0),
        )
    )
    server = ServerThread(create_app(engine, ServerSettings(model_name=MODEL, chat_template=GEMMA3_CHAT_TEMPLATE))).start()
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    order: list[str] = []
    lock = threading.Lock()

    def run(name: str, priority: str | int) -> None:
        api.completions.create(model=MODEL, prompt=f"Say {name}", max_tokens=3, temperature=0, extra_body={"priority": priority})
        with lock:
            order.append(name)

    try:
        threads = []
        for name, priority in [("low", "low"), ("normal-1", "normal"), ("urgent", 3), ("normal-2", 1), ("high", "high")]:
            threads.append(threading.Thread(target=run, args=(name, priority)))
            threads[-1].start()
            while engine.stats().waiting < len(threads) and threads[-1].is_alive():  # queued in this order
                time.sleep(0.01)
        engine.start()
        for t in threads:
            t.join(timeout=120)
        assert order == ["urgent", "high", "normal-1", "normal-2", "low"]
    finally:
        server.stop()
        engine.stop()


def test_a_request_the_queue_can_never_hold_is_a_400_and_admits_nothing(gemma_server):
    """200 prompts x n=8 is 1,600 choices; the queue holds 1,024: no retry can help, so not a 503."""
    body = {"prompt": ["hi"] * 200, "n": 8, "max_tokens": 4}
    r = httpx.post(f"{gemma_server.url}/v1/completions", json=body, timeout=30)
    error = assert_openai_error(r, 400, param="n")
    assert error["code"] == "too_many_choices" and "1600 choices" in error["message"] and "at most 1024" in error["message"]
    stats = httpx.get(f"{gemma_server.url}/v1/stats").json()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["blocks_referenced"]["device"] == 0
    ok = httpx.post(f"{gemma_server.url}/v1/completions", json={**body, "prompt": ["hi"] * 2, "n": 2}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4


def test_a_stream_cut_by_shutdown_ends_with_an_error_event_and_done(gemma_server):
    """A second server on the same engine, 2 s of grace: a long stream still open when the grace
    runs out gets a 503 error event and [DONE] (not a silent close), and its request is aborted."""
    server = ServerThread(
        create_app(gemma_server.engine, ServerSettings(model_name=MODEL, chat_template=GEMMA3_CHAT_TEMPLATE)), grace_seconds=2.0
    ).start()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "stream": True}
    stopper = threading.Thread(target=server.stop)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        first = json.loads(next(lines)[6:])
        stopper.start()
        rest = list(lines)
    stopper.join(timeout=60)
    assert first["choices"][0]["finish_reason"] is None
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    deadline = time.monotonic() + 30
    while gemma_server.engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gemma_server.engine.stats().running == 0


def test_models_report_the_longest_sequence_this_server_takes(gemma_server):
    """The device pool of this server holds 1,520 tokens (96 blocks of 16, one the sink), less
    than the model's 32,768-token context: /v1/models says what a request can really use."""
    card = httpx.get(f"{gemma_server.url}/v1/models", timeout=30).json()["data"][0]
    assert card["max_model_len"] == gemma_server.engine.max_sequence_tokens == 95 * 16
