"""Pythonic calls and Gemma's (the same calls, Google's prompt) on exact strings, whole and streamed."""

from __future__ import annotations

import pytest
from streamed import NAMES, TIME, WEATHER, joined, streamed

from wicore.api.tools.formats import FORMATS
from wicore.api.tools.request import Function
from wicore.api.tools.scan import Call

PYTHONIC = FORMATS["pythonic"]
GEMMA = FORMATS["gemma"]
PARIS = Call("get_weather", {"city": "Paris"})


@pytest.mark.parametrize("fmt", [PYTHONIC, GEMMA], ids=["pythonic", "gemma"])
@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('[get_weather(city="Paris")]', "", [PARIS]),
        ("[get_weather(city='Paris'), get_time()]", "", [PARIS, Call("get_time", {})]),
        ('get_weather(city="Paris")', "", [PARIS]),  # a bare call of a declared tool
        ('Let me see.\n[get_weather(city="Paris")]', "Let me see.", [PARIS]),
        ('```tool_code\n[get_weather(city="Paris")]\n```', "", [PARIS]),  # Gemma's cookbook fence
        ('Sure.\n```python\nget_weather(city="Paris")\n```\n', "Sure.", [PARIS]),
        # Python and JSON literals alike; tuples become lists
        (
            '[get_time(zone=None, ok=True, also=false, n=-2.5, xs=(1, 2), d={"a": null})]',
            "",
            [Call("get_time", {"zone": None, "ok": True, "also": False, "n": -2.5, "xs": [1, 2], "d": {"a": None}})],
        ),
        ("[1] is a footnote.", "[1] is a footnote.", []),
        ("Call get_weather(city) when you can.", "Call get_weather(city) when you can.", []),
    ],
)
def test_parse(fmt, text, content, calls):
    assert fmt.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize(
    "text",
    [
        '[book_flight(to="Oslo")]',  # not a declared tool
        '[get_weather("Paris")]',  # positional arguments
        "[get_weather(city=lookup())]",  # not a literal
        "[get_weather(**kw)]",
        '[get_weather(city="Paris")',  # cut short
        '[get_weather(city="Paris"), print("hi")]',  # one bad call spoils the list
    ],
)
def test_malformed_calls_stay_content(text):
    assert PYTHONIC.parse(text, NAMES) == (text, [])


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_streamed_in_pieces_adds_up_to_the_whole(step):
    text = 'I will check both.\n```tool_code\n[get_weather(city="Paris"), get_time(zone="CET")]\n```'
    assert (
        joined(streamed("gemma", text, step))
        == GEMMA.parse(text, NAMES)
        == (
            "I will check both.",
            [PARIS, Call("get_time", {"zone": "CET"})],
        )
    )


def test_stream_holds_a_line_only_while_it_may_open_a_call():
    # "[" and "get_wea" may open a call; "[1" and "get_weird" cannot
    assert joined(streamed("pythonic", "[1] a\nget_weird()")) == ("[1] a\nget_weird()", [])
    releases = streamed("pythonic", "ok\n[get_time()]")
    assert releases == [(1, "o", []), (2, "k", []), (15, "", [Call("get_time", {})])]


def test_render_calls_reads_back():
    calls = [Call("get_weather", {"city": 'Pa"ris', "unit": "c"}), Call("get_time", {"zone": None, "flags": [True, {"k": 1}]})]
    written = PYTHONIC.render_calls(calls)
    assert written == '[get_weather(city="Pa\\"ris", unit="c"), get_time(zone=None, flags=[True, {"k": 1}])]'
    assert PYTHONIC.parse(written, NAMES) == ("", calls)


def test_names_that_python_cannot_call_are_refused():
    PYTHONIC.check((WEATHER, TIME))
    with pytest.raises(ValueError, match="'get-weather' is not a Python identifier"):
        PYTHONIC.check((Function("get-weather", {}),))
    with pytest.raises(ValueError, match="parameter 'x-y'"):
        GEMMA.check((Function("f", {"properties": {"x-y": {}}}),))
    FORMATS["hermes"].check((Function("get-weather", {"properties": {"x-y": {}}}),))  # JSON writes any name
