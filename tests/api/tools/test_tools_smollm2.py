"""A weather-tool round trip on the real SmolLM2-135M-Instruct through `wicore serve` and the
openai client, tool_choice auto (slow layer). Its chat template takes no tools, so it sees the
hermes prompt (wicore.api.tools.formats.hermes). tool_choice required: test_tools_enforced.py."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
QUESTION = {"role": "user", "content": "What is the weather like in Paris?"}
RESULT = '{"city": "Paris", "temperature_c": 22, "sky": "sunny"}'


def checked_calls(choice) -> list[dict]:
    """The choice's calls, each of a declared function with arguments valid against its parameters."""
    calls = choice.message.tool_calls or []
    assert (choice.finish_reason == "tool_calls") is bool(calls)
    for call in calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    return [c.model_dump() for c in calls]


@pytest.mark.slow
def test_weather_round_trip_with_tool_choice_auto(smollm2, launch):
    proc, url = launch(smollm2(), "--served-model-name", "smollm2")
    try:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        ask = dict(model="smollm2", tools=[WEATHER], tool_choice="auto", max_tokens=32, temperature=0)
        first = api.chat.completions.create(messages=[QUESTION], **ask).choices[0]
        calls = checked_calls(first)
        # this small model answers in words: the answer is content, with no call read into it
        assert not calls and first.message.content.startswith("The weather in Paris is quite unique.")
        # a client that called the tool anyway sends the call and the tool's answer back
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
        history.append({"role": "tool", "tool_call_id": "call_1", "content": RESULT})
        final = api.chat.completions.create(messages=history, **ask).choices[0]
        streamed = api.chat.completions.create(messages=history, stream=True, **ask)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        # The same turn through the Responses API: the call and its output as input items
        items = [
            {"role": "user", "content": QUESTION["content"]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": RESULT},
        ]
        flat = {"type": "function", **WEATHER["function"]}
        response = api.responses.create(model="smollm2", input=items, tools=[flat], max_output_tokens=32, temperature=0)
        forced = api.responses.create(
            model="smollm2", input=QUESTION["content"], tools=[flat], tool_choice="required", max_output_tokens=32, temperature=0
        )
    finally:
        proc.terminate()
        proc.wait(30)
    assert final.finish_reason == "stop" and final.message.tool_calls is None
    assert final.message.content == "The weather in Paris is described in the JSON object returned by the function."
    assert text == final.message.content
    assert (response.status, response.output_text) == ("completed", final.message.content)
    first_call = forced.output[0]
    assert first_call.type == "function_call" and first_call.name == "get_weather"
    jsonschema.validate(json.loads(first_call.arguments), WEATHER["function"]["parameters"])
