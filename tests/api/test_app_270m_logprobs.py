"""Logprobs and penalties through the OpenAI endpoints on the real Gemma 3 270M."""

from __future__ import annotations

import math

import openai
import pytest
from app_checks import CHAT, MODEL

from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow


def test_chat_logprobs_with_top_logprobs_streamed_and_not(gemma_client):
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    full = gemma_client.chat.completions.create(**kwargs)
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
    for chunk in gemma_client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = gemma_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == full.choices[0].message.content


def test_completion_logprobs_follow_the_engine_tokens(gemma_client, gemma_server):
    tok = gemma_server.engine.tokenizer
    prompt = "The capital of France is"
    expected_ids = gemma_server.engine.generate([tok.encode(prompt)], SamplingParams(max_tokens=8))[0].token_ids
    out = gemma_client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp.tokens == [tok.decode([i]) for i in expected_ids]
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and top[token] == logprob == max(top.values())
    streamed = {"tokens": [], "text_offset": [], "token_logprobs": []}
    for chunk in gemma_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3, stream=True
    ):
        for key in streamed:
            streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert (streamed["tokens"], streamed["text_offset"]) == (lp.tokens, lp.text_offset)
    assert streamed["token_logprobs"] == pytest.approx(lp.token_logprobs, abs=1e-5)
    only_chosen = gemma_client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0)
    assert only_chosen.choices[0].logprobs.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]


def test_a_stop_string_cuts_the_logprobs_with_the_text(gemma_client):
    prompt = "The capital of France is"
    full = gemma_client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=1).choices[0]
    words = full.text.split(" ")
    stop = f"{words[2][-2:]} {words[3][:2]}"  # begins inside one token, ends inside a later one
    cut = full.text.index(stop)
    kept = sum(offset < cut for offset in full.logprobs.text_offset)  # tokens whose text begins before the cut
    assert 0 < kept < 12
    for stream in (False, True):
        out = gemma_client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=1, stop=stop, stream=stream
        )
        chunks = list(out) if stream else [out]
        text = "".join(c.choices[0].text for c in chunks)
        tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
        assert text == full.text[:cut]
        assert tokens == full.logprobs.tokens[:kept] and offsets == full.logprobs.text_offset[:kept]
        assert "".join(tokens).startswith(text)


def test_frequency_penalty_lowers_exactly_the_repeated_tokens(gemma_client):
    prompt = "Count: 1 1 1 1 1 1 1 1"

    def run(penalty: float):
        out = gemma_client.completions.create(
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


def test_out_of_range_logprobs_and_penalties_are_400_naming_them(gemma_client):
    for kwargs, param in [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            gemma_client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, **kwargs)
        assert info.value.param == param and param in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        gemma_client.completions.create(model=MODEL, prompt="a", max_tokens=2, logprobs=6)
    assert info.value.param == "logprobs"
