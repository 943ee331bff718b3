"""vLLM's /tokenize and /detokenize, /v1/models/{id}, and the sampling knobs over HTTP
(logit_bias, min_p, repetition_penalty), on the tiny random multimodal Gemma 3 (it has a tokenizer)."""

from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def served(multimodal_server):
    return multimodal_server()


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json=body, timeout=60)


def test_tokenize_gives_the_ids_the_endpoints_run(served):
    tok = served.engine.tokenizer
    r = post(served, "/tokenize", {"prompt": "hello world", "return_token_strs": True})
    ids = tok.encode("hello world")
    assert r.status_code == 200
    assert r.json() == {
        "count": len(ids),
        "max_model_len": served.engine.max_sequence_tokens,
        "tokens": ids,
        "token_strs": [tok.id_to_token(i) for i in ids],
    }
    messages = [{"role": "user", "content": "hello"}]
    chat = post(served, "/tokenize", {"model": "tiny-mm", "messages": messages}).json()
    assert chat["tokens"] == tok.encode(tok.apply_chat_template(messages), add_bos=False) and chat["token_strs"] is None
    ran = post(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert ran["usage"]["prompt_tokens"] == chat["count"]


def test_detokenize_is_the_inverse(served):
    ids = served.engine.tokenizer.encode("hello world", add_bos=False)
    assert post(served, "/detokenize", {"tokens": ids}).json() == {"prompt": "hello world"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
        ("/detokenize", {"tokens": [1, 10_000_000]}, 400, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
        ("/detokenize", {"tokens": [1], "model": "other"}, 404, "model"),
    ],
)
def test_bad_tokenize_bodies_get_openai_shaped_errors(served, path, body, status, param):
    r = post(served, path, body)
    assert (r.status_code, r.json()["error"]["param"]) == (status, param)


def test_models_retrieve_gets_the_card_or_a_404(served):
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    card = client.models.retrieve("tiny-mm")
    assert (card.id, card.object, card.owned_by) == ("tiny-mm", "model", "wicore")
    assert card.model_dump()["max_model_len"] == served.engine.max_sequence_tokens
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' does not exist"):
        client.models.retrieve("gpt-4")


def greedy_ids(served, **extra) -> list[int]:
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True, **extra}
    text = post(served, "/v1/completions", body).json()["choices"][0]["text"]
    return post(served, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]


def test_logit_bias_removes_and_forces_tokens(served):
    first = greedy_ids(served)[0]
    assert greedy_ids(served, logit_bias={str(first): -100})[0] != first
    forced = served.engine.tokenizer.encode(" world", add_bos=False)[-1]
    assert greedy_ids(served, logit_bias={str(forced): 100}) == [forced] * 6


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"abc": 1}),
        ("logit_bias", {"-1": 1}),
        ("logit_bias", {"5": 101}),
        ("logit_bias", {"5": "1"}),
        ("logit_bias", {"100000": 5}),  # past the vocabulary
        ("logit_bias", [5]),
        ("min_p", 1.5),
        ("repetition_penalty", 0),
        ("repetition_penalty", "2"),
    ],
)
def test_bad_sampling_knobs_are_400s_naming_them(served, field, value):
    r = post(served, "/v1/completions", {"prompt": "hello", "max_tokens": 2, field: value})
    assert (r.status_code, r.json()["error"]["param"]) == (400, field), r.text


def test_min_p_and_repetition_penalty_are_taken(served):
    body = {"prompt": "hello", "max_tokens": 4, "temperature": 0.7, "seed": 3, "min_p": 0.9, "repetition_penalty": 1.3}
    r = post(served, "/v1/completions", body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
