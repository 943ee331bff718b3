"""The OpenAI endpoints on the real Gemma 3 270M, driven by the official openai package."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE  # the packaged base model chats through it (--chat-template)
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

MODEL = "gemma3-270m"
CHAT = [{"role": "user", "content": "Say hello in French"}]


@pytest.fixture(scope="module")
def client(gemma_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gemma_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


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


def test_chat_streamed_deltas_join_to_the_non_streamed_text(client, gemma_server):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    tok = gemma_server.engine.tokenizer
    prompt_ids = tok.encode(tok.apply_chat_template(CHAT), add_bos=False)
    assert full.usage.prompt_tokens == len(prompt_ids)
    assert full.usage.completion_tokens == 16 and full.usage.total_tokens == len(prompt_ids) + 16
    assert full.choices[0].finish_reason == "length" and full.choices[0].message.role == "assistant"
    text, reason, usage = stream_text(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert text == full.choices[0].message.content and text
    assert reason == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (full.usage.prompt_tokens, 16)


def test_completions_match_the_engine(client, gemma_server):
    tok = gemma_server.engine.tokenizer
    ids = tok.encode("The capital of France is")
    expected = gemma_server.engine.generate([ids], SamplingParams(max_tokens=8))[0].token_ids
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert out.choices[0].text == tok.decode(expected)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 8)
    streamed, _, _ = stream_text(
        client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
    )
    assert streamed == out.choices[0].text


def test_stop_string_split_across_tokens_never_appears(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    words = full.split(" ")
    # A stop string that starts inside one token and ends inside the next: "ital of" in "capital of" style.
    stop = f"{words[2][-2:]} {words[3][:2]}"
    assert stop in full and len(words[2]) > 2
    expected = full[: full.index(stop)]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop, "zzz"])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    pieces = []
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=stop, stream=True):
        pieces.append(chunk.choices[0].text)
    assert "".join(pieces) == expected
    assert all(stop not in p for p in pieces)


def test_n_choices_and_prompt_lists(client):
    out = client.completions.create(model=MODEL, prompt=["Hello", "One two three"], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text and out.choices[2].text == out.choices[3].text
    assert out.usage.completion_tokens == 16
    sampled = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=1.0, seed=1, n=3, extra_body={"priority": "urgent"}
    )
    assert len(sampled.choices) == 3 and sampled.usage.completion_tokens <= 18
    again = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=1.0, seed=1, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in sampled.choices]  # seeded


def test_prompt_longer_than_the_context_is_400_with_both_numbers(client, gemma_server):
    limit = gemma_server.engine.max_sequence_tokens
    assert limit == 95 * 16  # 96 device blocks of 16 tokens, one of them the padding sink
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=[5] * (limit + 10), max_tokens=4)
    assert f"has {limit + 10} tokens" in info.value.message and f"holds {limit} tokens" in info.value.message
    assert info.value.param == "prompt"
    assert info.value.code == "context_length_exceeded"


def test_n_choices_of_a_prompt_too_long_admit_nothing(gemma_server):
    limit = gemma_server.engine.max_sequence_tokens
    r = httpx.post(f"{gemma_server.url}/v1/completions", json={"model": MODEL, "prompt": [5] * (limit + 4), "n": 3})
    error = assert_openai_error(r, 400, "prompt")
    assert error["code"] == "context_length_exceeded" and f"has {limit + 4} tokens" in error["message"]
    messages = [{"role": "user", "content": "hello " * limit}]
    r = httpx.post(f"{gemma_server.url}/v1/chat/completions", json={"model": MODEL, "messages": messages, "n": 3})
    assert assert_openai_error(r, 400, "messages")["code"] == "context_length_exceeded"
    stats = httpx.get(f"{gemma_server.url}/v1/stats").json()
    assert (stats["running"], stats["waiting"]) == (0, 0)
    assert stats["blocks_referenced"] == {"device": 0, "host": 0, "nvme": 0}


def test_a_later_prompt_too_long_takes_back_the_choices_queued_before_it(gemma_server):
    """Prompts [short, too long] with n=3: the three choices of the short one are queued before
    the long one is refused; the API aborts them, so none runs to its end."""
    limit = gemma_server.engine.max_sequence_tokens
    before = gemma_server.engine.stats().generated_tokens
    body = {"model": MODEL, "prompt": [[2, 651, 6037], [5] * (limit + 4)], "n": 3, "max_tokens": 50, "temperature": 0}
    r = httpx.post(f"{gemma_server.url}/v1/completions", json=body)
    assert assert_openai_error(r, 400, "prompt")["code"] == "context_length_exceeded"
    stats = wait_idle(gemma_server)
    assert (stats["running"], stats["waiting"]) == (0, 0)
    assert stats["blocks_referenced"] == {"device": 0, "host": 0, "nvme": 0}
    assert stats["generated_tokens"] - before < 3 * 50


def test_max_tokens_is_capped_by_the_context_left(client, gemma_server):
    limit = gemma_server.engine.max_sequence_tokens
    out = client.completions.create(model=MODEL, prompt=[2] * (limit - 3), max_tokens=50, temperature=0)
    assert out.usage.completion_tokens <= 3


def test_token_ids_outside_the_vocabulary_are_400(gemma_server):
    r = httpx.post(f"{gemma_server.url}/v1/completions", json={"model": MODEL, "prompt": [2, 262144, 3]}, timeout=60)
    error = assert_openai_error(r, 400, param="prompt")
    assert error["message"] == "token ids must be in [0, 262144)" and error["code"] == "invalid_request"


def test_a_full_waiting_queue_is_503_and_queues_none_of_the_choices(gemma_270m):
    """Two choices, a queue of two with one place taken: the engine takes the first choice and
    refuses the second (OverloadedError), so the API takes the first back and answers 503 (a
    retry can succeed once the queue drains; more choices than the queue holds are a 400)."""
    config = EngineConfig(
        model_dir=gemma_270m(1), num_threads=2, verify_files=False, num_device_blocks=32, scheduler=SchedulerConfig(max_waiting=2)
    )
    with Engine(config) as engine:  # not started yet: what is queued stays waiting
        blocker = engine.add_request([2, 651, 6037], SamplingParams(max_tokens=1))
        server = ServerThread(create_app(engine, ServerSettings(model_name=MODEL, chat_template=GEMMA3_CHAT_TEMPLATE))).start()
        try:
            r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hello", "n": 2})
            assert assert_openai_error(r, 503)["code"] == "overloaded" and r.headers["retry-after"] == "1"
            too_many = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hello", "n": 3})
            assert assert_openai_error(too_many, 400, param="n")["code"] == "too_many_choices"
            engine.cancel(blocker)
            engine.start()  # the engine drops the requests taken back, running none of them
            deadline = time.monotonic() + 30
            while engine.stats().waiting and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = engine.stats()
            assert (stats.running, stats.waiting) == (0, 0)
            assert stats.computed_prompt_tokens == stats.generated_tokens == 0
        finally:
            server.stop()


def test_concurrent_streaming_clients_all_complete(client, gemma_server):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(8)]
    expected = [client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0).choices[0].text for p in prompts]
    results: list[tuple[str, str | None] | None] = [None] * len(prompts)

    def run(i: int) -> None:
        text, reason, _ = stream_text(
            client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=10, temperature=0, stream=True)
        )
        results[i] = (text, reason)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [r[0] if r else None for r in results] == expected
    assert all(r and r[1] in ("length", "stop") for r in results)


def test_disconnecting_clients_leave_no_running_requests_and_no_referenced_blocks(gemma_server):
    before = gemma_server.engine.stats().generated_tokens
    for _ in range(3):
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{gemma_server.url}/v1/completions", json=body, timeout=60) as r:
            events = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["choices"]
                    events += 1
                if events == 3:
                    break  # leaving the block closes the connection mid-stream
    stats = wait_idle(gemma_server)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["blocks_referenced"] == {"device": 0, "host": 0, "nvme": 0}
    assert stats["generated_tokens"] - before < 3 * 400  # the requests were aborted, not run to the end


def test_32_concurrent_chat_streams_are_complete_and_correct(client):
    prompts = [f"Write the number {i} in words." for i in range(32)]
    expected = [
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=6, temperature=0)
        .choices[0]
        .message.content
        for p in prompts[:4]
    ]
    results: list[tuple[str, str | None, object] | None] = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = stream_text(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompts[i]}],
                max_tokens=6,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r is not None for r in results)
    assert [r[0] for r in results[:4]] == expected  # batching changes nothing
    for _, reason, usage in results:
        assert reason in ("length", "stop") and usage.completion_tokens <= 6
        assert reason == "stop" or usage.completion_tokens == 6


def test_50_clients_disconnecting_mid_stream_leave_no_blocks_in_use(gemma_server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0.8, "stream": True}

    def run() -> None:
        with httpx.stream("POST", f"{gemma_server.url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break

    threads = [threading.Thread(target=run) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stats = wait_idle(gemma_server, timeout=60)
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["swapped"] == 0
    assert stats["blocks_referenced"] == {"device": 0, "host": 0, "nvme": 0}


def test_a_non_streaming_client_that_gives_up_aborts_its_request(gemma_server):
    before = gemma_server.engine.stats().generated_tokens
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gemma_server.url}/v1/completions", json=body, timeout=1.5)
    stats = wait_idle(gemma_server)
    assert stats["running"] == 0 and stats["blocks_referenced"]["device"] == 0
    assert stats["generated_tokens"] - before < 1000


def test_messages_the_chat_template_rejects_are_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
    assert "chat template" in info.value.message
    assert info.value.body["param"] == "messages" and info.value.body["code"] == "invalid_request"  # type: ignore[index]


def test_metrics_count_tokens_and_latencies(client, gemma_server):
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    text = httpx.get(f"{gemma_server.url}/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values["wicore_generated_tokens_total"] >= 3
    assert values["wicore_time_to_first_token_seconds_count"] >= 1
    assert values["wicore_inter_token_seconds_count"] >= 2
    assert values['wicore_requests_total{route="/v1/completions",status="200"}'] >= 1


# -- logprobs, penalties -------------------------------------------------------------------
def test_chat_logprobs_with_top_logprobs_streamed_and_not(client):
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    full = client.chat.completions.create(**kwargs)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens == 8 and full.choices[0].finish_reason == "length"
    assert "".join(e.token for e in content) == full.choices[0].message.content
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == 5 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        # Greedy: the chosen token is the most likely one, and its logprob the largest.
        assert (entry.token, entry.logprob) == (top[0].token, top[0].logprob) and entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode()) and top[1].bytes == list(top[1].token.encode())
        assert sum(math.exp(t.logprob) for t in top) <= 1 + 1e-9
    streamed = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == full.choices[0].message.content


def test_completion_logprobs_follow_the_engine_tokens(client, gemma_server):
    tok = gemma_server.engine.tokenizer
    prompt = "The capital of France is"
    expected_ids = gemma_server.engine.generate([tok.encode(prompt)], SamplingParams(max_tokens=8))[0].token_ids
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp.tokens == [tok.decode([i]) for i in expected_ids]
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and top[token] == logprob == max(top.values())
    streamed = {"tokens": [], "text_offset": [], "token_logprobs": []}
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3, stream=True):
        for key in streamed:
            streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert (streamed["tokens"], streamed["text_offset"]) == (lp.tokens, lp.text_offset)
    assert streamed["token_logprobs"] == pytest.approx(lp.token_logprobs, abs=1e-5)
    only_chosen = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0)
    assert only_chosen.choices[0].logprobs.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]


def test_a_stop_string_cuts_the_logprobs_with_the_text(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=1).choices[0]
    words = full.text.split(" ")
    stop = f"{words[2][-2:]} {words[3][:2]}"  # begins inside one token, ends inside a later one
    cut = full.text.index(stop)
    kept = sum(offset < cut for offset in full.logprobs.text_offset)  # tokens whose text begins before the cut
    assert 0 < kept < 12
    for stream in (False, True):
        out = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=1, stop=stop, stream=stream
        )
        chunks = list(out) if stream else [out]
        text = "".join(c.choices[0].text for c in chunks)
        tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
        assert text == full.text[:cut]
        assert tokens == full.logprobs.tokens[:kept] and offsets == full.logprobs.text_offset[:kept]
        assert "".join(tokens).startswith(text)


def test_frequency_penalty_lowers_exactly_the_repeated_tokens(client):
    prompt = "Count: 1 1 1 1 1 1 1 1"

    def run(penalty: float):
        out = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, logprobs=5, frequency_penalty=penalty
        )
        return out.choices[0].logprobs

    plain, penalised = run(0.0), run(2.0)
    counts: dict[str, int] = {}
    for token, logprob, top in zip(penalised.tokens, penalised.token_logprobs, penalised.top_logprobs):
        # Logprobs are the raw model's; greedy picked the best of them less 2 per earlier use.
        score = logprob - 2.0 * counts.get(token, 0)
        assert all(score >= v - 2.0 * counts.get(t, 0) - 1e-9 for t, v in top.items())
        counts[token] = counts.get(token, 0) + 1
    assert penalised.tokens[0] == plain.tokens[0]  # nothing to penalise yet
    assert penalised.token_logprobs[0] == pytest.approx(plain.token_logprobs[0], abs=1e-5)
    assert max(counts.values()) < max(plain.tokens.count(t) for t in plain.tokens)
    assert any(t != max(top, key=top.get) for t, top in zip(penalised.tokens, penalised.top_logprobs))


def test_out_of_range_logprobs_and_penalties_are_400_naming_them(client):
    for kwargs, param in [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, **kwargs)
        assert info.value.param == param and param in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="a", max_tokens=2, logprobs=6)
    assert info.value.param == "logprobs"


# -- failures and priority ------------------------------------------------------------------
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
