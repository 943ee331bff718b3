"""tool_choice required / a named function: the grammar makes every answer calls that parse, with
arguments valid against the function's parameters (slow layer, real models).

These need the engine's constrained decoding (SamplingParams.structured, branch `structured`):
on a tree without it the grammar is not applied and they fail. Everything before the engine (the
grammar each format builds, llguidance accepting exactly the calls it should) is tested on every
tree by test_tool_grammars.py and test_tools_app.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}, "hours_ahead": {"type": "integer", "minimum": 0, "maximum": 48}},
            "required": ["zone"],
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
QUESTIONS = ["What is the weather like in Paris?", "Tell me a joke.", "What time is it in Tokyo?", "Bonjour !"]


def served(model_dir, name: str, chat_template: str | None = None) -> Iterator[str]:
    engine = Engine(EngineConfig(model_dir=model_dir, num_threads=2, host_tier_gb=0)).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name=name, chat_template=chat_template))).start()
    yield f"{server.url}/v1"
    server.stop()
    engine.stop()


@pytest.fixture(scope="module")
def smollm2_url(smollm2) -> Iterator[str]:
    yield from served(smollm2(), "smollm2")


@pytest.fixture(scope="module")
def gemma_url(gemma_270m) -> Iterator[str]:
    yield from served(gemma_270m(1), "gemma", GEMMA3_CHAT_TEMPLATE)  # the packaged 270M is a base model


def answer(url: str, model: str, stream: bool, **request) -> tuple[str | None, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of one choice, joined from the stream if streamed."""
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    if not stream:
        choice = api.chat.completions.create(model=model, **request).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content, calls, choice.finish_reason
    content, parts, reason = "", {}, None
    for chunk in api.chat.completions.create(model=model, stream=True, **request):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                entry = parts.setdefault(delta.index, ["", ""])
                entry[0] += delta.function.name or ""
                entry[1] += delta.function.arguments or ""
            reason = choice.finish_reason or reason
    return content or None, [tuple(parts[i]) for i in sorted(parts)], reason


def assert_valid(calls: list[tuple[str, str]], names: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 7)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("question", QUESTIONS)
def test_required_always_calls_smollm2(smollm2_url, question, temperature, seed, stream):
    content, calls, reason = answer(
        smollm2_url,
        "smollm2",
        stream,
        messages=[{"role": "user", "content": question}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=temperature,
        seed=seed,
    )
    assert reason == "tool_calls" and content is None and len(calls) == 1
    assert_valid(calls, {"get_weather", "get_time"})


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_named_function_is_the_one_called(smollm2_url, stream):
    content, calls, reason = answer(
        smollm2_url,
        "smollm2",
        stream,
        messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=96,
        temperature=0,
    )
    assert reason == "stop" and content is None  # a named function's call: OpenAI's and vLLM's finish
    assert_valid(calls, {"get_time"})


@pytest.mark.slow
def test_required_with_parallel_calls_parses_every_call(smollm2_url):
    _, calls, reason = answer(
        smollm2_url,
        "smollm2",
        False,
        messages=[{"role": "user", "content": "Weather in Paris and in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    assert reason in ("tool_calls", "length")  # a model may go on calling up to max_tokens; each call parses
    assert_valid(calls, {"get_weather"})


@pytest.mark.slow
def test_weather_round_trip_with_tool_choice_required_through_wicore_serve(smollm2, launch):
    proc, url = launch(smollm2(), "--served-model-name", "smollm2")
    question = {"role": "user", "content": "What is the weather like in Paris?"}
    try:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        ask = dict(model="smollm2", tools=[WEATHER], max_tokens=96, temperature=0)
        first = api.chat.completions.create(messages=[question], tool_choice="required", parallel_tool_calls=False, **ask)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert_valid([(call.function.name, call.function.arguments)], {"get_weather"})
        history = [question, choice.message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 22, "sky": "sunny"}'})
        final = api.chat.completions.create(messages=history, **ask).choices[0]  # tool_choice auto: it may answer
    finally:
        proc.terminate()
        proc.wait(30)
    if final.message.tool_calls:  # or call again, validly
        assert_valid([(c.function.name, c.function.arguments) for c in final.message.tool_calls], {"get_weather"})
    else:
        assert final.finish_reason in ("stop", "length") and final.message.content


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_always_calls_gemma(gemma_url, stream):
    """The real Gemma 3 270M (a base model): Google's prompt, Python calls, enforced."""
    content, calls, reason = answer(
        gemma_url,
        "gemma",
        stream,
        messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=0,
    )
    assert reason == "tool_calls" and content is None
    assert_valid(calls, {"get_weather", "get_time"})


@pytest.mark.slow
def test_langchain_bind_tools_required(smollm2_url):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=smollm2_url, api_key="unused", model="smollm2", temperature=0, max_tokens=96, max_retries=0)
    message = model.bind_tools([WEATHER], tool_choice="required", parallel_tool_calls=False).invoke(
        [HumanMessage("Weather in Paris?")]
    )
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    jsonschema.validate(message.tool_calls[0]["args"], SCHEMAS["get_weather"])
