"""The Hermes / Qwen `<tool_call>` format on exact strings, whole and streamed."""

from __future__ import annotations

import pytest
from streamed import NAMES, joined, streamed

from wicore.api.tools.formats import FORMATS
from wicore.api.tools.scan import Call

HERMES = FORMATS["hermes"]
PARIS = Call("get_weather", {"city": "Paris"})
ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (ONE, "", [PARIS]),
        ("Let me check.\n" + ONE + "\n", "Let me check.", [PARIS]),
        (
            ONE + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
            "",
            [PARIS, Call("get_time", {"zone": "CET"})],
        ),
        # SmolLM2's documented way: a list in one block; arguments written as a JSON string
        (
            '<tool_call>[{"name": "get_time", "arguments": "{}"}, {"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>',
            "",
            [Call("get_time", {}), PARIS],
        ),
        # the model stopped after the JSON, without the closing tag
        ('<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
        ("The weather is fine.", "The weather is fine.", []),
        ("a < b and <tool> tags", "a < b and <tool> tags", []),
    ],
)
def test_parse(text, content, calls):
    assert HERMES.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',  # not JSON
        '<tool_call>\n{"name": "book_flight", "arguments": {}}\n</tool_call>',  # not a declared tool
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "get_weather", "argu',  # cut short (max_tokens)
    ],
)
def test_malformed_calls_stay_content(text):
    assert HERMES.parse(text, NAMES) == (text, [])


def test_malformed_block_between_calls_is_content_and_the_calls_go_on():
    bad = "<tool_call>oops</tool_call>"
    assert HERMES.parse(f"{ONE}\n{bad}\n{ONE}", NAMES) == ("\n" + bad, [PARIS, PARIS])


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_in_pieces_adds_up_to_the_whole(step):
    text = "Let me check.\n" + ONE + "\n" + ONE.replace("Paris", "Oslo") + "\nDone."
    releases = streamed("hermes", text, step)
    assert (
        joined(releases)
        == HERMES.parse(text, NAMES)
        == (
            "Let me check.\nDone.",
            [PARIS, Call("get_weather", {"city": "Oslo"})],
        )
    )


def test_stream_holds_a_possible_tag_and_releases_each_call_when_it_closes():
    text = "Hi <tool_c" + "all>\n" + '{"name": "get_time", "arguments": {}}\n</tool_call>'
    # "Hi" goes at once; " <tool_c..." is held (it may open a call); the call goes with its closing tag
    assert streamed("hermes", text) == [(1, "H", []), (2, "i", []), (len(text), "", [Call("get_time", {})])]


def test_stream_releases_text_once_it_cannot_be_a_tag():
    # " <tool_ca" is held while it may still open a call; "t" shows it does not
    assert streamed("hermes", "x <tool_cat> y") == [(1, "x", []), (11, " <tool_cat", []), (12, ">", []), (14, " y", [])]


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = ONE + "\n" + ONE.replace("Paris", "Oslo")
    assert joined(streamed("hermes", text, 5, parallel=False)) == ("", [PARIS])
