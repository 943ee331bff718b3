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


def test_stream_sends_json_that_is_no_call_as_soon_as_it_shows():
    # a line opening with "{" is held only while it may still be {"name": "<a declared tool>"
    releases = streamed("llama3_json", 'Sure\n{"answer": 1}')
    assert releases[:5] == [(1, "S", []), (2, "u", []), (3, "r", []), (4, "e", []), (8, '\n{"a', [])]
    assert streamed("llama3_json", '{"name": "Bob", "age": 3}')[0] == (11, '{"name": "B', [])
    text = '{"parameters": {}, "name": "get_time"}'  # name first, as Llama writes calls
    assert LLAMA.parse(text, NAMES) == (text, [])


def test_a_long_call_streams_in_linear_time():
    """A stream resumes its scan of an open call where the last one stopped (a 40 KB argument
    in 4-character pieces: 10,000 scans, each of the new characters only)."""
    text = '{"name": "get_weather", "parameters": {"city": "' + "x" * 40_000 + '"}}'
    assert joined(streamed("llama3_json", text, 4)) == ("", [Call("get_weather", {"city": "x" * 40_000})])
