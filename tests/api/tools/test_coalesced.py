"""A stream that fell behind gets several steps' tokens as one output (wicore.engine.channel merges
them): the app sends them as one chunk, with all their text, the exact usage and finish reason.
The scripted model (tests/api/tools/scripted.py: one token a byte) sends 5 tokens an output."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from scripted import ScriptedEngine, byte_tokenizer, serving

ANSWER = "Hello, world! \U0001f600 done"  # 23 bytes (the emoji is 4, at bytes 14-17), then <|im_end|>


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ScriptedEngine, str]]:
    with serving(byte_tokenizer(tmp_path_factory.mktemp("tok")), ANSWER, tokens_per_output=5) as served:
        yield served


def stream(url: str, **body: object) -> list[dict]:
    request = {"model": "m", "prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", f"{url}/v1/completions", json=request, timeout=30) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_merged_outputs_are_one_chunk_each_with_all_their_text(served):
    events = stream(served[1])
    pieces = [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in events if e["choices"]]
    # Outputs of bytes 0-4, 5-9, 10-14, 15-19, 20-23: the third ends inside the emoji, so its text
    # waits for the fourth; <|im_end|> (a special token) ends the last with no text of its own.
    assert pieces == [("Hello", None), (", wor", None), ("ld! \U0001f600 d", None), ("one", "stop")]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 24  # every token, however they were grouped


def test_a_stop_string_inside_a_merged_output_ends_the_count_at_its_token(served):
    events = stream(served[1], stop=["world"])
    pieces = [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in events if e["choices"]]
    assert "".join(text for text, _ in pieces) == "Hello, " and pieces[-1][1] == "stop"
    # "world" completes at byte 11, in the output of bytes 10-14: 12 tokens, not 15.
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_max_tokens_and_logprobs_through_merged_outputs(served):
    events = stream(served[1], max_tokens=12, logprobs=0)
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in choices) == "Hello, world" and choices[-1]["finish_reason"] == "length"
    tokens = [t for c in choices for t in c["logprobs"]["tokens"]]
    assert "".join(tokens) == "Hello, world" and len(tokens) == 12
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_a_prompt_of_token_ids_is_queued_as_sent(served):
    """Token ids skip the tokenizer's worker thread (wicore.api.app.API.prepare) and reach the engine as they are."""
    events = stream(served[1], prompt=[72, 105, 33])
    assert list(served[0].requests.values())[-1][0] == [72, 105, 33]
    assert events[-1]["usage"]["prompt_tokens"] == 3
