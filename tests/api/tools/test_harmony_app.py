"""gpt-oss's harmony answers through the real app on a scripted model (tests/api/tools/scripted.py)
with gpt-oss's chat template and special tokens: reasoning apart from content, calls as tool_calls."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from scripted import ScriptedEngine, harmony_tokenizer, serving

from wicore.structured.spec import StructuredKind

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ScriptedEngine, str]]:
    with serving(harmony_tokenizer(tmp_path_factory.mktemp("tok"))) as served:
        yield served


def chat(url: str, **body: object) -> dict:
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": ASK, **body}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_a_call_comes_back_as_tool_calls_and_the_reasoning_apart(served):
    served[0].answer = THINK + CALL
    choice = chat(served[1], tools=[WEATHER])
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert (message["content"], message["reasoning_content"]) == (None, "The user wants the weather.")
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    prompt = served[0].prompt_text()  # rendered by gpt-oss's own template: the tools as its TypeScript
    assert (
        "namespace functions {\n\n// The current weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;" in prompt
    )
    assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")


def test_without_tools_the_reasoning_is_not_content(served):
    served[0].answer = THINK + FINAL
    choice = chat(served[1])
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": "It is sunny.",
        "reasoning_content": "The user wants the weather.",
    }


def test_streamed_reasoning_content_and_calls(served):
    served[0].answer = THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + CALL
    body = {"model": "m", "messages": ASK, "tools": [WEATHER], "stream": True}
    with httpx.stream("POST", f"{served[1]}/v1/chat/completions", json=body, timeout=30) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    choices = [json.loads(line)["choices"][0] for line in lines[:-1]]
    deltas = [c["delta"] for c in choices]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants the weather."
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    assert all("<|" not in (d.get("content") or "") + d.get("reasoning_content", "") for d in deltas)
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert [c[0]["function"] for c in calls] == [{"name": "get_weather", "arguments": ""}, {"arguments": '{"city": "Paris"}'}]
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_a_named_function_is_enforced_with_the_harmony_grammar(served):
    served[0].answer = CALL[len("<|start|>assistant") :]
    choice = chat(served[1], tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    structured = served[0].requests[list(served[0].requests)[-1]][1].structured
    assert structured is not None and structured.kind is StructuredKind.GRAMMAR
    assert structured.value.startswith("start: analysis? call\n")  # an analysis message may come first
    assert '\ncall: call0\ncall0: <|channel|> "commentary to=functions.get_weather " ' in structured.value


def test_a_past_call_and_its_result_render_through_the_template(served):
    served[0].answer = FINAL
    history = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert chat(served[1], messages=history, tools=[WEATHER])["message"]["content"] == "It is sunny."
    assert (
        served[0]
        .prompt_text()
        .endswith(
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|><|start|>assistant'
        )
    )


PAST_CALL = {
    "role": "assistant",
    "reasoning_content": "Need the weather.",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
}
KEPT = "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"


def test_past_reasoning_stays_for_a_call_until_a_final_answer(served):
    """A past turn's reasoning_content goes to gpt-oss's template (as `thinking`), which keeps it
    before a call that no final answer has followed yet, and drops it once one has (harmony's rule);
    a final answer's own reasoning is never rendered."""
    served[0].answer = FINAL
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    chat(served[1], messages=[*ASK, PAST_CALL, result], tools=[WEATHER])
    assert KEPT in served[0].prompt_text()
    answered = {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Say it."}
    chat(served[1], messages=[*ASK, PAST_CALL, result, answered, {"role": "user", "content": "And Rome?"}], tools=[WEATHER])
    prompt = served[0].prompt_text()
    assert "analysis" not in prompt.split("<|start|>user<|message|>Weather in Paris?<|end|>")[1]
    assert "<|start|>assistant<|channel|>final<|message|>It is sunny.<|end|><|start|>user<|message|>And Rome?" in prompt


def test_reasoning_content_of_the_wrong_type_is_a_400(served):
    bad = {"role": "assistant", "content": "Hi.", "reasoning_content": ["no"]}
    response = httpx.post(f"{served[1]}/v1/chat/completions", json={"model": "m", "messages": [*ASK, bad, *ASK]}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[1].reasoning_content"


def test_a_tool_the_template_cannot_render_is_a_400(served):
    # gpt-oss's own template writes every tool's description: one without is refused there, as in transformers
    bare = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    response = httpx.post(f"{served[1]}/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": [bare]}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("the chat template rejected the messages: ")
    assert response.json()["error"]["param"] == "messages"
