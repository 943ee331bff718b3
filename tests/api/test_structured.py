"""Output constraints over HTTP: response_format, structured_outputs and guided_* parsed into one
StructuredOutput (400s naming the field), and a real server on the tiny chat model (random weights,
a real tokenizer) whose constrained answers parse, on chat, completions, /v1/inference and /v1/ws."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from served_app import start
from websockets.sync.client import connect

from wicore.api.app import ServerSettings
from wicore.api.errors import APIError
from wicore.api.schemas import parse_chat, parse_completion
from wicore.structured.spec import StructuredKind, StructuredOutput

USER = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, StructuredOutput(StructuredKind.JSON_OBJECT, "", "response_format")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
            StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "response_format.json_schema.schema"),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            StructuredOutput(StructuredKind.JSON_OBJECT, "", "response_format.json_schema"),
        ),
        (
            {"structured_outputs": {"json": SCHEMA}},
            StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "structured_outputs.json"),
        ),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "structured_outputs.json"),
        ),
        ({"structured_outputs": {"regex": "a+"}}, StructuredOutput(StructuredKind.REGEX, "a+", "structured_outputs.regex")),
        (
            {"structured_outputs": {"choice": ["a", "b"]}},
            StructuredOutput(StructuredKind.CHOICE, '["a", "b"]', "structured_outputs.choice"),
        ),
        (
            {"structured_outputs": {"grammar": 'start: "x"'}},
            StructuredOutput(StructuredKind.GRAMMAR, 'start: "x"', "structured_outputs.grammar"),
        ),
        (
            {"structured_outputs": {"json_object": True}},
            StructuredOutput(StructuredKind.JSON_OBJECT, "", "structured_outputs.json_object"),
        ),
        ({"guided_json": SCHEMA}, StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "guided_json")),
        ({"guided_regex": "[0-9]+"}, StructuredOutput(StructuredKind.REGEX, "[0-9]+", "guided_regex")),
        ({"guided_choice": ["yes", "no"]}, StructuredOutput(StructuredKind.CHOICE, '["yes", "no"]', "guided_choice")),
        ({"guided_grammar": 'root ::= "a"'}, StructuredOutput(StructuredKind.GRAMMAR, 'root ::= "a"', "guided_grammar")),
    ],
)
def test_every_form_of_constraint_is_read(extra, expected):
    assert parse_chat({"messages": USER, **extra}).options.structured == expected
    assert parse_completion({"prompt": "a", **extra}).options.structured == expected


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"response_format": "json"}, "response_format", "expected an object"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "choose text, json_object or json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "expected an object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}}},
            "response_format.json_schema.strict",
            "boolean",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
            "response_format.json_schema.schema",
            "JSON schema",
        ),
        ({"guided_json": "{not json"}, "guided_json", "the schema is not JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty list of strings"),
        ({"guided_choice": ["a", 1]}, "guided_choice", "non-empty list of strings"),
        ({"guided_regex": ""}, "guided_regex", "non-empty string"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "give one of"),
        ({"structured_outputs": "a+"}, "structured_outputs", "expected an object"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not supported"),  # never ignored
        ({"response_format": {"type": "structural_tag"}}, "response_format.type", "choose text, json_object or json_schema"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one output constraint"),
    ],
)
def test_malformed_or_several_constraints_are_a_400_naming_the_field(extra, param, message):
    with pytest.raises(APIError) as err:
        parse_chat({"messages": USER, **extra})
    assert err.value.status == 400 and err.value.param == param and message in err.value.message


@pytest.fixture(scope="module")
def chat_server(tiny_chat):
    served = start(tiny_chat[0], ServerSettings(model_name="tiny-chat"), num_device_blocks=256)
    yield served
    served.server.stop()
    served.engine.stop()


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json=body, timeout=60)


CHAT = {"messages": [{"role": "user", "content": "Give me a JSON object"}], "max_tokens": 48}


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
            "response_format.json_schema.schema",
            "response_format.json_schema.schema: the JSON schema cannot be compiled: Invalid type: strnig",
        ),
        ({"guided_regex": "(["}, "guided_regex", "guided_regex: the regular expression cannot be compiled:"),
        (
            {"structured_outputs": {"grammar": "start: nothing_here"}},
            "structured_outputs.grammar",
            "the grammar cannot be compiled:",
        ),
        ({"guided_json": {"type": "string", "format": "zipcode"}}, "guided_json", "Unknown format: zipcode"),
    ],
)
def test_a_constraint_the_library_cannot_compile_is_a_400_naming_the_field_and_the_reason(chat_server, extra, param, message):
    r = post(chat_server, "/v1/chat/completions", {**CHAT, **extra})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_schema" and message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_constrained_answers_on_every_endpoint(chat_server):
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "age", "schema": SCHEMA}}, "n": 2}
    r = post(chat_server, "/v1/chat/completions", {**body, "temperature": 1.0, "seed": 3})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        assert 0 <= json.loads(choice["message"]["content"])["age"] <= 99
    r = post(
        chat_server, "/v1/completions", {"prompt": "Answer:", "guided_choice": ["yes", "no"], "max_tokens": 8, "temperature": 0}
    )
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    r = post(chat_server, "/v1/inference", {"prompt": "Code:", "guided_regex": "[A-Z]{3}-[0-9]{2}", "max_tokens": 16})
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", r.json()["content"])
    with connect(chat_server.url.replace("http://", "ws://") + "/v1/ws", open_timeout=10) as ws:
        ws.send(
            json.dumps(
                {"type": "completion", "id": "r1", "body": {"prompt": "x", "guided_choice": ["red", "blue"], "max_tokens": 8}}
            )
        )
        text, reason = "", None
        while (frame := json.loads(ws.recv(timeout=30)))["type"] == "chunk":
            for choice in frame["chunk"]["choices"]:
                text += choice.get("text", "")
                reason = choice.get("finish_reason") or reason
        assert frame["type"] == "done", frame
        assert text in ("red", "blue") and reason == "stop"


def test_streamed_constrained_text_with_logprobs_and_a_stop_string(chat_server):
    body = {**CHAT, "guided_json": SCHEMA, "stream": True, "logprobs": True, "top_logprobs": 2, "temperature": 0.7, "seed": 1}
    with httpx.stream("POST", f"{chat_server.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in lines if c["choices"])
    assert 0 <= json.loads(text)["age"] <= 99
    tokens = [
        t for c in lines if c["choices"] and c["choices"][0].get("logprobs") for t in c["choices"][0]["logprobs"]["content"]
    ]
    assert "".join(t["token"] for t in tokens) == text
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in tokens)
    stopped = post(chat_server, "/v1/chat/completions", {**CHAT, "guided_json": SCHEMA, "stop": ['"age"']})
    assert stopped.json()["choices"][0] == {**stopped.json()["choices"][0], "finish_reason": "stop"}
    assert stopped.json()["choices"][0]["message"]["content"] == "{"


def test_a_model_without_a_tokenizer_refuses_a_constraint_naming_it(tiny_server):
    served = tiny_server()
    r = post(served, "/v1/completions", {"prompt": [1, 2, 3], "guided_regex": "a+", "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "guided_regex" and "structured output needs the model's tokenizer" in error["message"]
