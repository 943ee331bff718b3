"""`wicore bench throughput` and `wicore bench serve` on a tiny random Gemma 3, on the CPU: the
engine's public API and a real loopback Hypercorn server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.cli.bench import format_breakdown, level_configs, step_breakdown
from wicore.cli.load import LoadConfig, RequestTiming, Spread, one_request, random_prompts, summarize
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.trace import PhaseSeconds


def wicore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wicore.cli", *args], capture_output=True, text=True, timeout=300)


def test_random_prompts_are_seeded_and_below_the_vocabulary():
    prompts = random_prompts(3, 5, 9, seed=1, low=4)
    assert prompts == random_prompts(3, 5, 9, seed=1, low=4) != random_prompts(3, 5, 9, seed=2, low=4)
    assert [len(p) for p in prompts] == [5, 5, 5] and all(4 <= t < 9 for p in prompts for t in p)


def test_each_concurrency_level_sends_prompts_of_its_own():
    """A level that sent the level before's prompts would find them in the server's prefix cache."""
    config = LoadConfig("http://x", "m", num_prompts=4, input_len=6, output_len=2, vocab_size=1000, seed=7)
    levels = level_configs(config, [1, 64, 64])
    assert [(level, c.seed) for level, c in levels] == [(1, 7), (64, 8), (64, 9)]
    assert all(c == config.__class__(**{**config.__dict__, "seed": c.seed}) for _, c in levels)  # only the seed moves
    prompts = [random_prompts(c.num_prompts, c.input_len, c.vocab_size, c.seed) for _, c in levels]
    shared = {tuple(p) for p in prompts[0]} & {tuple(p) for p in prompts[1]} | {tuple(p) for p in prompts[1]} & {
        tuple(p) for p in prompts[2]
    }
    assert shared == set()


def test_summarize_times_each_request_from_its_chunks():
    a = RequestTiming(sent=0.0, chunk_times=[0.1, 0.2, 0.4], num_tokens=3)  # TTFT 100, TPOT 150 ms
    b = RequestTiming(sent=1.0, chunk_times=[1.3, 1.4, 1.5], num_tokens=3)  # TTFT 300, TPOT 100 ms
    failed = RequestTiming(sent=0.0, error="HTTP 503: busy")
    r = summarize(4, [a, b, failed], duration=2.0)
    assert (r.concurrency, r.num_completed, r.num_failed, r.num_output_tokens) == (4, 2, 1, 6)
    assert r.first_error == "HTTP 503: busy" and r.output_tokens_per_second == 3.0 and r.requests_per_second == 1.0
    assert r.ttft == Spread(pytest.approx(200.0), pytest.approx(200.0), pytest.approx(298.0))
    assert r.tpot == Spread(pytest.approx(125.0), pytest.approx(125.0), pytest.approx(149.5))
    # the gaps: 100, 200 (a) and 100, 100 (b)
    assert r.itl == Spread(pytest.approx(125.0), pytest.approx(100.0), pytest.approx(197.0))


def test_a_request_whose_tokens_came_in_one_chunk_has_no_tpot():
    """Four tokens in one chunk of text (a tokenizer holding text back): no time between tokens was
    seen, so the request adds to TTFT but not to TPOT or ITL, rather than a TPOT of 0."""
    whole = RequestTiming(sent=0.0, chunk_times=[0.5], num_tokens=4)
    r = summarize(1, [whole], duration=0.5)
    assert (r.num_completed, r.num_output_tokens, r.tpot, r.itl) == (1, 4, None, None)
    assert r.ttft == Spread(pytest.approx(500.0), pytest.approx(500.0), pytest.approx(500.0))
    flowing = RequestTiming(sent=0.0, chunk_times=[0.1, 0.4], num_tokens=4)  # 3 tokens after the first in 300 ms
    assert summarize(2, [whole, flowing], duration=0.5).tpot == Spread(*[pytest.approx(100.0)] * 3)


def test_a_request_whose_tokens_have_no_text_counts_at_its_end():
    """A stream of chunks without text (a random model repeating a special token) is a completed
    request whose first token arrives with the end, not a failure: a real loopback server streams
    such a completion."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    events = [{"choices": [{"text": "", "finish_reason": None}]}, {"choices": [{"text": "", "finish_reason": "length"}]}]
    events.append({"choices": [], "usage": {"completion_tokens": 2}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    async def completions(request):
        return StreamingResponse(iter([body]), media_type="text/event-stream")

    server = ServerThread(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])).start()

    async def one() -> RequestTiming:
        async with httpx.AsyncClient() as client:
            return await one_request(client, LoadConfig(server.url, "m", 1, 1, 2), [1])

    try:
        timing = asyncio.run(one())
    finally:
        server.stop()
    assert (timing.error, timing.num_tokens, len(timing.chunk_times)) == (None, 2, 1)


def test_a_token_text_holding_a_unicode_line_separator_is_one_event():
    """JSON leaves U+2028, U+2029 and U+0085 raw in a string; SSE splits lines at \\n alone."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    texts = ["a\u2028b", "c\x85", "\u2029d"]
    events = [{"choices": [{"text": t, "finish_reason": None}]} for t in texts]
    events.append({"choices": [], "usage": {"completion_tokens": 3}})
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n" for e in events) + "data: [DONE]\n\n"

    async def completions(request):
        return StreamingResponse(iter([body[:50], body[50:]]), media_type="text/event-stream")

    server = ServerThread(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])).start()

    async def one() -> RequestTiming:
        async with httpx.AsyncClient() as client:
            return await one_request(client, LoadConfig(server.url, "m", 1, 1, 3), [1])

    try:
        timing = asyncio.run(one())
    finally:
        server.stop()
    assert (timing.error, timing.num_tokens, len(timing.chunk_times)) == (None, 3, 3)


def test_load_config_takes_a_base_url_with_or_without_v1():
    assert (
        LoadConfig("http://h:1/v1/", "m", 1, 1, 1).url
        == LoadConfig("http://h:1", "m", 1, 1, 1).url
        == "http://h:1/v1/completions"
    )


def test_bench_throughput_runs_every_request_to_its_length(tiny_export, tmp_path):
    folder, _ = tiny_export()
    out = tmp_path / "t.json"
    res = wicore(
        "bench", "throughput", "--model", str(folder), "--num-prompts", "6", "--input-len", "9", "--output-len", "5",
        "--threads", "2", "--json", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Throughput: ") and "(6 requests of 9 + 5 tokens in " in res.stdout
    record = json.loads(out.read_text())
    assert (record["num_requests"], record["num_failed"], record["num_prompt_tokens"], record["num_output_tokens"]) == (
        6,
        0,
        54,
        30,
    )
    assert record["output_tokens_per_second"] == pytest.approx(30 / record["elapsed"])
    # 6 prompts of 9 tokens prefill in one step (the step's token budget holds them), then 4 decode steps
    assert record["num_steps"] == 5 and "A step: " in res.stdout and "; 5 steps" in res.stdout
    ms = record["step_ms"]
    parts = ms["schedule"] + ms["moves"] + ms["graphs"] + ms["run_host"] + ms["update"] + ms["loop"]
    assert ms["step"] == pytest.approx(parts) and min(ms.values()) >= 0 and ms["graphs"] > 0


def test_step_breakdown_is_each_phase_a_step_in_ms():
    before = PhaseSeconds(1.0, 0.5, 2.0, 1.0, 1.5)
    after = PhaseSeconds(1.2, 0.5, 2.8, 1.2, 2.1)  # 4 steps: 0.2 s scheduling, 0.8 s running (0.6 s graphs) ...
    ms = step_breakdown(after, before, 1.4, 4)
    assert ms is not None
    assert {k: round(v, 6) for k, v in ms.items()} == {
        "step": 350.0,
        "schedule": 50.0,
        "moves": 0.0,
        "graphs": 150.0,
        "run_host": 50.0,
        "update": 50.0,
        "loop": 50.0,
    }
    assert step_breakdown(after, before, 1.4, 0) is None


def test_breakdown_line_with_steps_in_flight_says_the_graphs_overlapped():
    # Async scheduling's numbers from an H200 run: the engine thread waited 6.50 ms a step for graphs of 12.36
    ms = {"step": 14.59, "schedule": 5.84, "moves": 0.0, "graphs": 12.36, "run_host": -5.86, "update": 1.59, "loop": 0.66}
    assert format_breakdown(ms) == (
        "A step: 14.59 ms, the graphs 12.36 of it overlapped with the host's work (steps in flight: schedule 5.84, "
        "KV moves 0.00, update 1.59, engine loop 0.66; the engine thread waited 6.50 for the device)"
    )
    plain = {**ms, "step": 20.0, "run_host": 0.5}
    assert format_breakdown(plain) == (
        "A step: 20.00 ms, of which graphs 12.36 and host 7.64 (schedule 5.84, KV moves 0.00, "
        "run outside the graphs 0.50, update 1.59, engine loop 0.66)"
    )


@pytest.fixture(scope="module")
def server_url(tiny_multimodal) -> Iterator[str]:
    """A real Hypercorn server on a loopback port, in front of a tiny engine with a tokenizer
    (streamed text needs one); its key is "k"."""
    folder = tiny_multimodal.export()
    engine = Engine(EngineConfig(model_dir=folder, num_threads=2, verify_files=False, num_device_blocks=128)).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name="tiny", api_keys=("k",)))).start()
    yield server.url
    server.stop()
    engine.stop()


def test_bench_serve_loads_a_real_server_at_each_concurrency(server_url, tmp_path):
    out = tmp_path / "s.json"
    res = wicore(
        "bench", "serve", "--base-url", server_url, "--api-key", "k", "--concurrency", "1,3", "--num-prompts", "4",
        "--input-len", "6", "--output-len", "4", "--vocab-size", "400", "--min-token-id", "20", "--json", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    levels = json.loads(out.read_text())["levels"]
    assert [(lv["concurrency"], lv["num_completed"], lv["num_failed"], lv["num_output_tokens"]) for lv in levels] == [
        (1, 4, 0, 16),
        (3, 4, 0, 16),
    ]
    for lv in levels:
        assert 0 < lv["ttft"]["p50"] <= lv["ttft"]["p99"]
        # TPOT and ITL exist exactly when some request's text came in two chunks or more (a tiny
        # random model's tokens may decode to text only at the end), and are then times
        assert (lv["tpot"] is None) == (lv["itl"] is None)
        assert lv["tpot"] is None or (lv["tpot"]["mean"] > 0 and lv["itl"]["p99"] > 0)
    assert res.stdout.count("concurrency ") == 2 and "  TTFT mean " in res.stdout and "  ITL  mean " in res.stdout


def test_bench_serve_spreads_a_level_over_client_processes(server_url, tmp_path):
    out = tmp_path / "s.json"
    res = wicore(
        "bench", "serve", "--base-url", server_url, "--api-key", "k", "--concurrency", "3", "--num-prompts", "5",
        "--input-len", "6", "--output-len", "4", "--vocab-size", "400", "--min-token-id", "20", "--processes", "2",
        "--json", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (level,) = json.loads(out.read_text())["levels"]
    # 5 prompts over two processes (3 and 2 of them, 2 and 1 in flight): every one in the summary
    assert (level["concurrency"], level["num_completed"], level["num_failed"], level["num_output_tokens"]) == (3, 5, 0, 20)
    assert 0 < level["ttft"]["p50"] <= level["ttft"]["p99"] and level["itl"]["p99"] > 0
    assert level["duration"] * 1e3 >= level["ttft"]["p99"]  # timed from the common start, not a process's own


def test_bench_serve_refuses_zero_processes():
    res = wicore("bench", "serve", "--base-url", "http://127.0.0.1:1", "--served-model-name", "m", "--processes", "0")
    assert res.returncode == 2
    assert res.stderr == "wicore: error: --processes must be at least 1, got 0\n"


def test_bench_serve_without_a_server_is_one_line(tmp_path):
    from wicore.api.server import free_port

    res = wicore("bench", "serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--served-model-name", "m")
    assert res.returncode == 2
    assert res.stderr.startswith("wicore: error: cannot reach http://127.0.0.1:") and res.stderr.count("\n") == 1


def test_bench_serve_with_a_wrong_key_says_the_first_request_failed(server_url):
    res = wicore("bench", "serve", "--base-url", server_url, "--served-model-name", "tiny", "--api-key", "wrong")
    assert res.returncode == 2
    assert res.stderr.startswith(f"wicore: error: {server_url}/v1/completions: the first request failed: HTTP 401")
