"""The OpenAI endpoints on the real Gemma 3 270M, driven by the official openai package: texts,
streams, limits, many clients, metrics (logprobs: test_app_270m_logprobs.py; failures and
priority: test_app_270m_failures.py)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from app_checks import CHAT, MODEL, assert_openai_error, stream_text, wait_idle

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE  # the packaged base model chats through it (--chat-template)
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow


def test_chat_streamed_deltas_join_to_the_non_streamed_text(gemma_client, gemma_server):
    full = gemma_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    tok = gemma_server.engine.tokenizer
    prompt_ids = tok.encode(tok.apply_chat_template(CHAT), add_bos=False)
    assert full.usage.prompt_tokens == len(prompt_ids)
    assert full.usage.completion_tokens == 16 and full.usage.total_tokens == len(prompt_ids) + 16
    assert full.choices[0].finish_reason == "length" and full.choices[0].message.role == "assistant"
    text, reason, usage = stream_text(
        gemma_client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert text == full.choices[0].message.content and text
    assert reason == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (full.usage.prompt_tokens, 16)


def test_completions_match_the_engine(gemma_client, gemma_server):
    tok = gemma_server.engine.tokenizer
    ids = tok.encode("The capital of France is")
    expected = gemma_server.engine.generate([ids], SamplingParams(max_tokens=8))[0].token_ids
    out = gemma_client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert out.choices[0].text == tok.decode(expected)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 8)
    streamed, _, _ = stream_text(
        gemma_client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
    )
    assert streamed == out.choices[0].text


def test_stop_string_split_across_tokens_never_appears(gemma_client):
    prompt = "The capital of France is"
    full = gemma_client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    words = full.split(" ")
    # A stop string that starts inside one token and ends inside the next: "ital of" in "capital of" style.
    stop = f"{words[2][-2:]} {words[3][:2]}"
    assert stop in full and len(words[2]) > 2
    expected = full[: full.index(stop)]
    out = gemma_client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop, "zzz"])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    pieces = []
    for chunk in gemma_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=stop, stream=True
    ):
        pieces.append(chunk.choices[0].text)
    assert "".join(pieces) == expected
    assert all(stop not in p for p in pieces)


def test_n_choices_and_prompt_lists(gemma_client):
    out = gemma_client.completions.create(model=MODEL, prompt=["Hello", "One two three"], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text and out.choices[2].text == out.choices[3].text
    assert out.usage.completion_tokens == 16
    sampled = gemma_client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=1.0, seed=1, n=3, extra_body={"priority": "urgent"}
    )
    assert len(sampled.choices) == 3 and sampled.usage.completion_tokens <= 18
    again = gemma_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=1.0, seed=1, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in sampled.choices]  # seeded


def test_prompt_longer_than_the_context_is_400_with_both_numbers(gemma_client, gemma_server):
    limit = gemma_server.engine.max_sequence_tokens
    assert limit == 95 * 16  # 96 device blocks of 16 tokens, one of them the padding sink
    with pytest.raises(openai.BadRequestError) as info:
        gemma_client.completions.create(model=MODEL, prompt=[5] * (limit + 10), max_tokens=4)
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


def test_max_tokens_is_capped_by_the_context_left(gemma_client, gemma_server):
    limit = gemma_server.engine.max_sequence_tokens
    out = gemma_client.completions.create(model=MODEL, prompt=[2] * (limit - 3), max_tokens=50, temperature=0)
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


def test_concurrent_streaming_clients_all_complete(gemma_client, gemma_server):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(8)]
    expected = [
        gemma_client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0).choices[0].text for p in prompts
    ]
    results: list[tuple[str, str | None] | None] = [None] * len(prompts)

    def run(i: int) -> None:
        text, reason, _ = stream_text(
            gemma_client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=10, temperature=0, stream=True)
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


def test_32_concurrent_chat_streams_are_complete_and_correct(gemma_client):
    prompts = [f"Write the number {i} in words." for i in range(32)]
    expected = [
        gemma_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=6, temperature=0)
        .choices[0]
        .message.content
        for p in prompts[:4]
    ]
    results: list[tuple[str, str | None, object] | None] = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = stream_text(
            gemma_client.chat.completions.create(
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


def test_messages_the_chat_template_rejects_are_400(gemma_client):
    with pytest.raises(openai.BadRequestError) as info:
        gemma_client.chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
    assert "chat template" in info.value.message
    assert info.value.body["param"] == "messages" and info.value.body["code"] == "invalid_request"  # type: ignore[index]


def test_metrics_count_tokens_and_latencies(gemma_client, gemma_server):
    gemma_client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    text = httpx.get(f"{gemma_server.url}/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values["wicore_generated_tokens_total"] >= 3
    assert values["wicore_time_to_first_token_seconds_count"] >= 1
    assert values["wicore_inter_token_seconds_count"] >= 2
    assert values['wicore_requests_total{route="/v1/completions",status="200"}'] >= 1
