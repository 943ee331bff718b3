"""The Llama 3 JSON format on exact strings, whole and streamed."""

from __future__ import annotations

import pytest
from streamed import NAMES, joined, streamed

from wicore.api.tools.formats import FORMATS
from wicore.api.tools.scan import Call

LLAMA = FORMATS["llama3_json"]
PARIS = Call("get_weather", {"city": "Paris"})
ONE = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (ONE, "", [PARIS]),
        ("<|python_tag|>" + ONE, "", [PARIS]),  # the tag, when special tokens are decoded
        ('  {"name": "get_weather", "arguments": {"city": "Paris"}}\n', "", [PARIS]),
        ("I will look it up.\n" + ONE, "I will look it up.", [PARIS]),
        (ONE + '; {"name": "get_time", "parameters": {}}', "", [PARIS, Call("get_time", {})]),
        (ONE + ";", "", [PARIS]),
        ("Paris is sunny {today}.", "Paris is sunny {today}.", []),
    ],
)
def test_parse(text, content, calls):
    assert LLAMA.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize(
    "text",
    [
        '{"answer": 42}',  # an answer in JSON is no call
        '{"name": "Bob", "age": 3}',  # nor an object whose "name" is no declared tool
        '{"name": "get_weather", "parameters": {"city": Paris}}',  # not JSON
        '{"name": "get_weather", "parameters": {"ci',  # cut short
    ],
)
def test_malformed_calls_stay_content(text):
    assert LLAMA.parse(text, NAMES) == (text, [])


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_streamed_in_pieces_adds_up_to_the_whole(step):
    text = "Checking.\n" + ONE + '; {"name": "get_time", "parameters": {"zone": "UTC"}}'
    assert (
        joined(streamed("llama3_json", text, step))
        == LLAMA.parse(text, NAMES)
        == (
            "Checking.",
            [PARIS, Call("get_time", {"zone": "UTC"})],
        )
    )


def test_stream_sends_prose_at_once_and_holds_a_line_that_opens_with_a_brace():
    text = 'Sure\n{"answer": 1}'
    releases = streamed("llama3_json", text)
    assert releases[:4] == [(1, "S", []), (2, "u", []), (3, "r", []), (4, "e", [])]
    # the JSON line is held until it closes (or the text ends), then it is content: no call
    assert releases[4:] == [(len(text), '\n{"answer": 1}', [])]
