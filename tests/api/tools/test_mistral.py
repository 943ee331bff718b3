"""Mistral's v3 tool calls (a JSON list after [TOOL_CALLS]) on exact strings, whole and streamed,
and through the real app with a Mistral-style template whose [TOOL_CALLS] is a special token."""

from __future__ import annotations

import json

import httpx
import pytest
from scripted import byte_tokenizer, serving
from streamed import NAMES, joined, streamed

from wicore.api.tools.formats import FORMATS, format_for_template
from wicore.api.tools.scan import Call

MISTRAL = FORMATS["mistral"]
PARIS = Call("get_weather", {"city": "Paris"})
NOON = Call("get_time", {"zone": "CET"})
LIST = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (LIST, "", [PARIS, NOON]),
        (" " + LIST, "", [PARIS, NOON]),  # the [TOOL_CALLS] token decoded away, its space kept
        ("[TOOL_CALLS] " + LIST, "", [PARIS, NOON]),  # a vocabulary that writes it as text
        ('[{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]', "", [PARIS]),  # quoted arguments
        ("It is sunny in Paris.", "It is sunny in Paris.", []),
        ("[1, 2, 3] are numbers.", "[1, 2, 3] are numbers.", []),  # a list, not of calls
        ('[{"name": "book_flight", "arguments": {}}]', '[{"name": "book_flight", "arguments": {}}]', []),  # undeclared
        ('[{"name": "get_weather", "argu', '[{"name": "get_weather", "argu', []),  # cut by max_tokens
    ],
)
def test_parse(text, content, calls):
    assert MISTRAL.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_streamed_calls_come_when_the_list_closes(step):
    releases = streamed("mistral", " " + LIST, step)
    assert joined(releases) == ("", [PARIS, NOON])
    assert [r[0] for r in releases] == [len(LIST) + 1]  # nothing before the list's last bracket


def test_streamed_content_goes_as_soon_as_it_cannot_open_a_list():
    assert streamed("mistral", "Sunny.") == [(i + 1, c, []) for i, c in enumerate("Sunny.")]


def test_a_template_with_tool_calls_picks_the_format():
    assert format_for_template(MISTRAL_TEMPLATE).name == "mistral"


# Mistral 7B Instruct v0.3's way, abridged: tools before the last user turn, calls and results in its tokens
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{{ m['content'] }}[/INST]"
    "{% elif m['role'] == 'assistant' %}{% if m['tool_calls'] %}[TOOL_CALLS]"
    "{{ m['tool_calls'] | map(attribute='function') | list | tojson }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]{% endif %}{% endfor %}"
)
SPECIALS = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_a_served_mistral_model_calls_through_its_special_token(tmp_path):
    tokenizer = byte_tokenizer(tmp_path / "tok", MISTRAL_TEMPLATE, SPECIALS, ("</s>",))
    with serving(tokenizer, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]') as (engine, url):
        ask = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
        choice = httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=30).json()["choices"][0]
        prompt = engine.prompt_text()
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"city": "Paris"}]
    assert prompt.startswith("[AVAILABLE_TOOLS][") and prompt.endswith("[INST]Weather?[/INST]")
