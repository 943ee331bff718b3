"""OpenAI's Responses API (`POST /v1/responses`, wicore/api/responses.py) through the real app and
the real openai client, on scripted models (tests/api/tools/scripted.py): the prompt each request
renders, the output items, the stream's events in order, and the 400s naming Responses fields."""

from __future__ import annotations

import json

import httpx
import pytest
from scripted import harmony_tokenizer, serving

from wicore.structured.spec import StructuredKind

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_a_string_input_answers_with_one_message(served, client):
    served[0].answer = "Paris."
    r = client.responses.create(model="m", input="Capital of France?")
    assert (r.status, r.output_text, r.incomplete_details, r.store) == ("completed", "Paris.", None, False)
    (item,) = r.output
    assert (item.type, item.role, item.status, item.id[:4]) == ("message", "assistant", "completed", "msg_")
    assert served[0].prompt_text() == SYSTEM + "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"
    prompt_tokens = len(served[0].requests[list(served[0].requests)[-1]][0])
    assert (r.usage.input_tokens, r.usage.output_tokens) == (prompt_tokens, len("Paris.") + 1)  # a token a byte, and the end


def test_instructions_and_input_items_become_the_conversation(served, client):
    served[0].answer = "Rome."
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Capital of Italy?"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Rome."}]},
        {"type": "message", "role": "user", "content": "And Spain?"},
    ]
    client.responses.create(model="m", instructions="Be brief.", input=items)
    assert served[0].prompt_text() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of Italy?<|im_end|>\n"
        "<|im_start|>assistant\nRome.<|im_end|>\n<|im_start|>user\nAnd Spain?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_call_is_a_function_call_item_and_its_output_goes_back(served, client):
    served[0].answer = CALL
    r = client.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], tool_choice="required")
    (call,) = r.output
    assert (call.type, call.name, call.arguments, call.status) == (
        "function_call",
        "get_weather",
        '{"city": "Paris"}',
        "completed",
    )
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert served[0].requests[list(served[0].requests)[-1]][1].structured.kind is StructuredKind.GRAMMAR  # required: enforced
    served[0].answer = "It is 21 degrees."
    follow = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
    ]
    r = client.responses.create(model="m", input=follow, tools=[WEATHER])
    assert r.output_text == "It is 21 degrees."
    prompt = served[0].prompt_text()
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt and '{"temp": 21}' in prompt


def test_a_json_schema_format_is_the_constraint(served, client):
    served[0].answer = '{"n": 3}'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.responses.create(
        model="m", input="A number", text={"format": {"type": "json_schema", "name": "num", "schema": schema}}
    )
    assert json.loads(r.output_text) == {"n": 3}
    spec = served[0].requests[list(served[0].requests)[-1]][1].structured
    assert (spec.kind, json.loads(spec.value)) == (StructuredKind.JSON, schema)
    assert r.text.format.type == "json_schema"


def test_max_output_tokens_makes_it_incomplete(served, client):
    served[0].answer = "A long answer."
    r = client.responses.create(model="m", input="x", max_output_tokens=4)
    assert (r.status, r.incomplete_details.reason, r.output_text) == ("incomplete", "max_output_tokens", "A lo")


def test_the_stream_sends_openais_events_in_order(served, client):
    served[0].answer = "Hi!"
    with client.responses.stream(model="m", input="Hello") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hi!" == final.output_text
    assert events[0].response.status == "in_progress" and final.id == events[0].response.id


def test_a_streamed_call_sends_its_arguments(served, client):
    served[0].answer = CALL
    events = list(client.responses.create(model="m", input="Weather?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == '{"city": "Paris"}'
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"


def test_harmony_reasoning_is_a_reasoning_item_before_the_message(tmp_path):
    answer = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    with serving(harmony_tokenizer(tmp_path / "tok"), answer) as (_, url):
        r = httpx.post(f"{url}/v1/responses", json={"model": "m", "input": "Go"}, timeout=30).json()
    assert [(o["type"], o["content"][0].get("text")) for o in r["output"]] == [("reasoning", "Think."), ("message", "Done.")]


@pytest.mark.parametrize(
    ("body", "param", "start"),
    [
        ({"input": []}, "input", "input: expected a string or a non-empty list"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "previous_response_id: nothing is stored"),
        ({"input": "x", "background": True}, "background", "background: background responses are not supported"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "tools[0]: 'web_search' tools are not supported"),
        ({"input": [{"type": "bogus"}]}, "input[0].type", "input[0].type: 'bogus' items are not supported"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "input[0].role: expected user, system"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens: 0 is out of range"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type", "text.format.type: 'xml'"),
        ({"input": "x", "tools": 0}, "tools", "tools: expected a list"),
        ({"input": "x", "tools": [{"type": "function", "name": 3}]}, "tools[0].name", "tools[0].name: "),
        ({"input": "x", "metadata": ["a"]}, "metadata", "metadata: expected an object of strings"),
    ],
)
def test_bad_requests_are_400s_naming_the_responses_field(served, body, param, start):
    response = httpx.post(f"{served[1]}/v1/responses", json={"model": "m", **body}, timeout=30)
    error = response.json()["error"]
    assert response.status_code == (404 if param == "model" else 400), response.text
    assert error["param"] == param and error["message"].startswith(start), error


def test_a_chat_checks_error_is_renamed_to_the_responses_field():
    from wicore.api.errors import APIError
    from wicore.api.responses import renamed

    schema = APIError(400, "response_format.json_schema.schema: cannot be compiled", "response_format.json_schema.schema")
    tool = APIError(400, "tools[1].function.name: expected a string", "tools[1].function.name")
    message = APIError(400, "messages[2].content: expected a string", "messages[2].content", code="invalid_value")
    first = APIError(400, "messages[0]: the template refused it", "messages[0]")
    origins = ["instructions", "input[0]", "input[2]"]  # input[1] was a call merged into input[0]'s message
    assert [(e.param, e.message) for e in (renamed(e, origins) for e in (schema, tool, message, first))] == [
        ("text.format.schema", "text.format.schema: cannot be compiled"),
        ("tools[1].name", "tools[1].name: expected a string"),
        ("input[2].content", "input[2].content: expected a string"),
        ("instructions", "instructions: the template refused it"),
    ]
