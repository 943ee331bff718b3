"""The prompt of a conversation with tools: templates that take `tools` render them as transformers
does; Gemma 3's and SmolLM2's (which take none) get their format's prompt."""

from __future__ import annotations

import json

import pytest
from scripted import CHATML, byte_tokenizer
from streamed import TIME, WEATHER

from wicore.api.tools.formats import FORMATS, format_for_template
from wicore.api.tools.prompt import template_inputs
from wicore.api.tools.request import ToolRequest
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

# A ChatML template that takes tools the way Qwen 2.5's does (written for this test)
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

PAST_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [PAST_CALL, {**PAST_CALL, "function": {"name": "get_time", "arguments": {}}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]
TOOLS = ToolRequest((WEATHER, TIME))


def test_a_template_that_takes_tools_renders_them_as_transformers_does(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = byte_tokenizer(tmp_path, TOOLS_TEMPLATE)
    assert tok.takes_tools
    messages, tools = template_inputs(HISTORY, TOOLS, FORMATS["hermes"], tok.takes_tools)
    assert messages == HISTORY and tools == [WEATHER.as_tool(), TIME.as_tool()]
    ours = tok.apply_chat_template(messages, tools=tools)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert ours == hf.apply_chat_template(
        messages, tools=tools, chat_template=TOOLS_TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert ours.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>" + json.dumps(WEATHER.as_tool()))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in ours
    assert format_for_template(TOOLS_TEMPLATE).name == "hermes"


def test_gemma_gets_googles_prompt_in_the_user_turn_and_results_fenced(tmp_path):
    tok = byte_tokenizer(tmp_path, GEMMA3_CHAT_TEMPLATE)
    assert not tok.takes_tools and format_for_template(GEMMA3_CHAT_TEMPLATE).name == "gemma"
    messages, tools = template_inputs(HISTORY, TOOLS, FORMATS["gemma"], tok.takes_tools)
    assert tools is None
    functions = json.dumps([WEATHER.as_tool()["function"], TIME.as_tool()["function"]], indent=2)
    assert tok.apply_chat_template(messages) == (
        "<start_of_turn>user\nBe brief.\n\n"
        "You have access to functions. If you decide to invoke any of the function(s), you MUST put it in the format of\n"
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n\n"
        "You SHOULD NOT include any other text in the response if you call a function\n"
        f"{functions}\n\nWeather in Paris and the time?<end_of_turn>\n"
        '<start_of_turn>model\n[get_weather(city="Paris"), get_time()]<end_of_turn>\n'
        "<start_of_turn>user\n```tool_output\n22 C\n```\n```tool_output\n12:00\n```<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_a_template_without_tools_and_no_tools_offered_keeps_the_history_readable(tmp_path):
    """tool_choice none (or no tools) on the turn after a call: no instructions, the history still renders."""
    tok = byte_tokenizer(tmp_path, CHATML)
    messages, _ = template_inputs(HISTORY[1:], None, FORMATS["hermes"], tok.takes_tools)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[2]["content"] == "The tool returned: 22 C\nThe tool returned: 12:00"
    assert messages[1]["content"].count("<tool_call>") == 2


@pytest.mark.parametrize(
    ("marker", "name"),
    [
        ("{{ '<tool_call>' }}", "hermes"),
        ("<|start_header_id|>", "llama3_json"),
        ("<|header_start|>", "pythonic"),
        ("<start_of_turn>", "gemma"),
        ("<|im_start|>", "hermes"),
        ("{{ messages }}", "hermes"),
    ],
)
def test_the_format_follows_the_template(marker, name):
    assert format_for_template(marker).name == name
