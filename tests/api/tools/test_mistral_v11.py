"""Mistral's v11 tool calls ([TOOL_CALLS]NAME[ARGS]{...}, one a call) on exact strings, whole and
streamed, and through the real app with a Mistral Small 3.2-style template whose markers are special tokens."""

from __future__ import annotations

import json

import httpx
import pytest
from scripted import byte_tokenizer, serving
from streamed import NAMES, joined, streamed
from test_mistral import SPECIALS as MISTRAL_SPECIALS
from test_mistral import WEATHER

from wicore.api.tools.formats import FORMATS, format_for_template
from wicore.api.tools.scan import Call

V11 = FORMATS["mistral_v11"]
PARIS = Call("get_weather", {"city": "Paris"})
NOON = Call("get_time", {"zone": "CET"})
TWO = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (TWO, "", [PARIS, NOON]),
        ("Let me check. " + TWO + "\n", "Let me check.", [PARIS, NOON]),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [PARIS]),
        ("It is sunny in Paris.", "It is sunny in Paris.", []),
        ("[TOOL_CALLS]book_flight[ARGS]{}", "[TOOL_CALLS]book_flight[ARGS]{}", []),  # undeclared
        ("[TOOL_CALLS]get_weather[ARGS][1]", "[TOOL_CALLS]get_weather[ARGS][1]", []),  # no object
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Par', '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', []),  # cut
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} and more', " and more", [PARIS]),
    ],
)
def test_parse(text, content, calls):
    assert V11.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_streamed_calls_go_as_their_arguments_close(step):
    releases = streamed("mistral_v11", "Checking." + TWO, step)
    assert joined(releases) == ("Checking.", [PARIS, NOON])
    first = len("Checking." + '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')
    if step == 1:
        assert [(r[0], r[2]) for r in releases if r[2]] == [(first, [PARIS]), (len("Checking." + TWO), [NOON])]
        assert "".join(r[1] for r in releases if r[0] <= len("Checking.")) == "Checking."  # content before the marker


def test_a_template_with_args_picks_v11_and_one_without_the_older_list():
    assert format_for_template(V11_TEMPLATE).name == "mistral_v11"
    assert format_for_template("{% if m['tool_calls'] %}[TOOL_CALLS]{{ m['tool_calls'] | tojson }}{% endif %}").name == "mistral"


# Mistral Small 3.2's way, abridged: tools before the last user turn, each call as [TOOL_CALLS]NAME[ARGS]{...}
V11_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{{ m['content'] }}[/INST]"
    "{% elif m['role'] == 'assistant' %}{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}"
    "[TOOL_CALLS]{{ c['function']['name'] }}[ARGS]{{ c['function']['arguments'] | tojson }}{% endfor %}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]{% endif %}{% endfor %}"
)
SPECIALS = (*MISTRAL_SPECIALS, "[ARGS]")  # the older format's markers and v11's own


@pytest.mark.parametrize("stream", [False, True])
def test_a_served_v11_model_calls_through_its_special_tokens(tmp_path, stream):
    tokenizer = byte_tokenizer(tmp_path / "tok", V11_TEMPLATE, SPECIALS, ("</s>",))
    answer = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    with serving(tokenizer, answer) as (engine, url):
        ask = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "stream": stream}
        reply = httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=30)
        prompt = engine.prompt_text()
    assert prompt.startswith("[AVAILABLE_TOOLS][") and prompt.endswith("[INST]Weather?[/INST]")
    if not stream:
        message = reply.json()["choices"][0]["message"]
        assert reply.json()["choices"][0]["finish_reason"] == "tool_calls" and message["content"] == "Sure."
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
        assert calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
        return
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    arguments: dict[int, str] = {}
    for d in deltas:
        for call in d.get("tool_calls") or []:
            arguments[call["index"]] = arguments.get(call["index"], "") + call["function"].get("arguments", "")
    assert {i: json.loads(a) for i, a in arguments.items()} == {0: {"city": "Paris"}, 1: {"city": "Rome"}}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [
        "tool_calls"
    ]


def test_the_forced_grammar_writes_the_markers_as_text_that_reads_as_calls(tmp_path):
    """llguidance names a special token in a grammar only by id, so tool_choice's grammar spells
    [TOOL_CALLS] and [ARGS] in plain tokens; the text is the same and parses into the calls."""
    import llguidance
    from streamed import TIME
    from streamed import WEATHER as WEATHER_FUNCTION

    tokenizer = byte_tokenizer(tmp_path / "tok", V11_TEMPLATE, SPECIALS, ("</s>",))
    lltok = llguidance.LLTokenizer(
        (tmp_path / "tok" / "tokenizer.json").read_text(), eos_token=list(tokenizer.info.eos_token_ids)
    )
    matcher = llguidance.LLMatcher(
        lltok, llguidance.LLMatcher.grammar_from_lark(V11.grammar((WEATHER_FUNCTION, TIME), True)), log_level=0
    )
    assert not matcher.is_error()
    special = tokenizer.encode("[TOOL_CALLS]", add_bos=False)
    assert len(special) == 1 and matcher.validate_tokens(special) == 0  # the special token is refused
    spelled = [lltok.tokenize_bytes(bytes([b]))[0] for b in TWO.encode()]
    assert matcher.consume_tokens(spelled) and matcher.is_accepting()
    assert V11.parse(lltok.decode_str(spelled), NAMES) == ("", [PARIS, NOON])
