"""Speculative decoding through the API (the tiny random multimodal Gemma 3, which has a tokenizer):
the per-request opt-out, /v1/stats and vLLM's metric names."""

from __future__ import annotations

import httpx
import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.speculative import SpeculativeConfig

PROMPT = "one two three four five one two three four five one two three"  # repeats itself: prompt lookup has drafts


@pytest.fixture(scope="module")
def spec_server(tiny_multimodal):
    config = EngineConfig(
        model_dir=tiny_multimodal.export(), num_threads=2, verify_files=False, speculative=SpeculativeConfig("ngram")
    )
    engine = Engine(config).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name="tiny"))).start()
    yield server
    server.stop()
    engine.stop()


def complete(url: str, **extra: object) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def spec_stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/stats").json()["speculative"]


def test_opt_out_runs_no_drafts_and_the_text_is_the_same(spec_server):
    url = spec_server.url
    before = spec_stats(url)
    plain = complete(url, speculative=False)
    assert spec_stats(url)["num_drafts"] == before["num_drafts"]
    speculated = complete(url)
    after = spec_stats(url)
    assert after["num_drafts"] > before["num_drafts"]
    assert speculated["choices"][0]["text"] == plain["choices"][0]["text"]
    assert 0.0 <= after["acceptance_rate"] <= 1.0 and after["method"] == "ngram"


def test_a_non_boolean_opt_out_is_refused(spec_server):
    response = httpx.post(f"{spec_server.url}/v1/completions", json={"model": "tiny", "prompt": PROMPT, "speculative": "no"})
    assert response.status_code == 400 and "speculative" in response.text


def test_metrics_carry_vllms_speculative_counters(spec_server):
    complete(spec_server.url)
    stats = spec_stats(spec_server.url)
    text = httpx.get(f"{spec_server.url}/metrics").text
    assert f"vllm:spec_decode_num_drafts_total {float(stats['num_drafts'])}" in text
    assert f"vllm:spec_decode_num_draft_tokens_total {float(stats['num_draft_tokens'])}" in text
    assert f"vllm:spec_decode_num_accepted_tokens_total {float(stats['num_accepted_tokens'])}" in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
