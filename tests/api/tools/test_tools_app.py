"""Tool calling through the real app, the real openai client and LangChain, on a scripted model
(tests/api/tools/scripted.py): exact request checks, answers and stream chunks."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from scripted import ScriptedEngine

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.structured.spec import StructuredKind

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_call_comes_back_as_message_tool_calls(served, client):
    served[0].answer = CALL
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) == 29 and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.function.arguments == '{"city": "Paris"}'  # a JSON string, as OpenAI sends it
    assert served[0].requests[reply.id + "-0"][1].structured is None  # auto: nothing enforced


def test_text_around_calls_is_the_content(served, client):
    served[0].answer = "Checking both.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo")
    choice = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER]).choices[0]
    assert choice.message.content == "Checking both."
    assert [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls] == ["Paris", "Oslo"]
    assert len({c.id for c in choice.message.tool_calls}) == 2


def test_an_answer_without_a_call_is_plain_content(served, client):
    served[0].answer = "It is sunny <tool> in Paris."
    choice = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER]).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == (
        "stop",
        "It is sunny <tool> in Paris.",
        None,
    )


def test_a_call_cut_by_max_tokens_stays_content_and_ends_with_length(served, client):
    served[0].answer = CALL
    choice = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=30).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", CALL[:30], None)


def test_streamed_calls_have_openais_delta_shape(served):
    served[0].answer = "On it.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo")
    body = {"model": "m", "messages": ASK, "tools": [WEATHER], "stream": True}
    with httpx.stream("POST", f"{served[1]}/v1/chat/completions", json=body, timeout=30) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    choices = [json.loads(line)["choices"][0] for line in lines[:-1]]
    deltas = [c["delta"] for c in choices]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == "On it."
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    ids = [calls[0][0]["id"], calls[2][0]["id"]]
    assert calls == [
        [{"index": 0, "id": ids[0], "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}],
        [{"index": 1, "id": ids[1], "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        [{"index": 1, "function": {"arguments": '{"city": "Oslo"}'}}],
    ]
    assert ids[0] != ids[1] and all(i.startswith("call_") for i in ids)
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["tool_calls"]
    assert deltas[-1] == {}


def test_the_openai_client_joins_streamed_calls(served, client):
    served[0].answer = CALL
    stream = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True, n=2)
    joined: dict[int, dict[int, list[str]]] = {0: {}, 1: {}}
    reasons = {}
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = joined[choice.index].setdefault(delta.index, ["", ""])
                entry[0] += (delta.function.name or "") if delta.function else ""
                entry[1] += (delta.function.arguments or "") if delta.function else ""
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    assert joined == {i: {0: ["get_weather", '{"city": "Paris"}']} for i in (0, 1)}
    assert reasons == {0: "tool_calls", 1: "tool_calls"}


@pytest.mark.parametrize(
    "request_fields",
    [{"parallel_tool_calls": False}, {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}],
    ids=["parallel_tool_calls-false", "named-function"],
)
def test_one_call_at_most_keeps_the_first(served, client, request_fields):
    served[0].answer = CALL + "\n" + CALL.replace("Paris", "Oslo")
    choice = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], **request_fields).choices[0]
    assert [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls] == ["Paris"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("tool_choice", "reason"),
    [("auto", "tool_calls"), ("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")],
)
def test_a_named_function_call_finishes_with_stop_as_openai_and_vllm_say(served, client, tool_choice, reason, stream):
    served[0].answer = CALL
    ask = dict(model="m", messages=ASK, tools=[WEATHER], tool_choice=tool_choice)
    if stream:
        chunks = list(client.chat.completions.create(**ask, stream=True))
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [reason]
        return
    choice = client.chat.completions.create(**ask).choices[0]
    assert choice.finish_reason == reason and choice.message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_reads_no_calls_and_shows_no_tools(served, client):
    served[0].answer = CALL
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert (reply.choices[0].finish_reason, reply.choices[0].message.content) == ("stop", CALL)
    assert "get_weather" not in served[0].prompt_text()


@pytest.mark.parametrize(
    ("choice", "grammar_start"),
    [("required", 'start: call ("\\n" call)*\n'), ({"type": "function", "function": {"name": "get_time"}}, "start: call\n")],
)
def test_required_and_a_named_function_put_a_grammar_on_the_request(served, client, choice, grammar_start):
    served[0].answer = CALL
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice)
    structured = served[0].requests[reply.id + "-0"][1].structured
    assert structured is not None and structured.kind == StructuredKind.GRAMMAR and structured.field == "tool_choice"
    assert structured.value.startswith(grammar_start)
    assert ('"get_weather"' in structured.value) is (choice == "required")  # a named function: only it


def test_the_prompt_describes_the_tools_and_renders_the_history(served, client):
    """SmolLM2's template takes no tools: the hermes prompt goes into the system turn, a past call is
    written as the model writes one, the tool's result comes back in a user turn."""
    served[0].answer = "It is 22 C and sunny in Paris."
    history = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 22, "sky": "sunny"}'},
    ]
    reply = client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
    assert reply.choices[0].message.content == "It is 22 C and sunny in Paris." and reply.choices[0].finish_reason == "stop"
    tool_json = json.dumps(WEATHER)
    assert served[0].prompt_text() == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to help with the user's request. "
        "The functions are described within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_json}\n</tools>\n\nTo call a function, reply with a JSON object of its name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\n{CALL}<|im_end|>\n"
        '<|im_start|>user\nThe tool returned: {"temp_c": 22, "sky": "sunny"}<|im_end|>\n'
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"tools": {"a": 1}}, "tools", "expected a list of tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]", 'expected {"type": "function"'),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters, digits"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "two tools are named 'get_weather'"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'sometimes': choose none, auto, required"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "no tool is named 'nope'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "required needs tools"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "expected a boolean"),
        ({"messages": [{"role": "tool", "content": "22"}]}, "messages[0].tool_call_id", "needs the id"),
        ({"messages": [{"role": "user", "content": "hi", "tool_call_id": 5}]}, "messages[0].tool_call_id", "a string"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f", "arguments": "{}"}}]}]},
            "messages[0].tool_calls[0]",
            '"id": "<string>"',
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{bad"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
            "expected a JSON object",
        ),
    ],
)
def test_bad_tool_fields_are_400s_naming_the_field(served, client, extra, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", **{"messages": ASK, **extra})
    assert info.value.status_code == 400 and info.value.param == param and message in info.value.message


def test_langchain_bind_tools(served):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "22 C, sunny"

    served[0].answer = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    model = ChatOpenAI(base_url=f"{served[1]}/v1", api_key="unused", model="m", max_retries=0).bind_tools([get_weather])
    asked = model.invoke([HumanMessage("Weather in Paris?")])
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("get_weather", {"city": "Paris"})]
    served[0].answer = "22 C and sunny."
    answer = model.invoke(
        [HumanMessage("Weather in Paris?"), asked, ToolMessage("22 C, sunny", tool_call_id=asked.tool_calls[0]["id"])]
    )
    assert answer.content == "22 C and sunny." and answer.tool_calls == []
    assert "<|im_start|>user\nThe tool returned: 22 C, sunny<|im_end|>" in served[0].prompt_text()


def test_a_websocket_chat_streams_the_same_tool_call_deltas(served):
    from websockets.sync.client import connect

    served[0].answer = "On it.\n" + CALL
    with connect(served[1].replace("http", "ws", 1) + "/v1/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "a", "body": {"model": "m", "messages": ASK, "tools": [WEATHER]}}))
        frames = []
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(json.loads(ws.recv(timeout=30)))
    chunks = [f["chunk"]["choices"][0] for f in frames if f["type"] == "chunk"]
    assert frames[-1]["type"] == "done" and chunks[-1]["finish_reason"] == "tool_calls"
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "On it."
    calls = [c["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["delta"]]
    assert [(c["index"], c["function"]) for c in calls] == [
        (0, {"name": "get_weather", "arguments": ""}),
        (0, {"arguments": '{"city": "Paris"}'}),
    ]


def test_the_tool_call_parser_setting_overrides_the_templates_choice(served):
    """`wicore serve --tool-call-parser pythonic` on a ChatML model: its prompt and its parser."""
    engine = ScriptedEngine(served[0].tokenizer, 'Sure.\n[get_weather(city="Paris")]')
    server = ServerThread(create_app(engine, ServerSettings(model_name="m", tool_call_parser="pythonic"))).start()  # type: ignore[arg-type]
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)
        choice = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER]).choices[0]
    finally:
        server.stop()
    assert choice.message.content == "Sure." and choice.message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert "[func_name1(params_name1=params_value1" in engine.prompt_text()


def test_wicore_serve_checks_the_tool_call_parser_name(tiny_export):
    from wicore.cli.main import parse_command_line, prepare_serve
    from wicore.errors import UsageError

    folder = str(tiny_export()[0])
    _, settings = prepare_serve(parse_command_line(["serve", "--model", folder, "--tool-call-parser", "gemma"]))
    assert settings.tool_call_parser == "gemma"
    with pytest.raises(
        UsageError,
        match="^tool_call_parser 'nope': choose one of hermes, llama3_json, pythonic, gemma, harmony, mistral, mistral_v11$",
    ):
        prepare_serve(parse_command_line(["serve", "--model", folder, "--tool-call-parser", "nope"]))


def test_enforced_calls_and_another_output_constraint_are_a_400():
    from wicore.api.errors import APIError
    from wicore.api.schemas import Options
    from wicore.api.tools.formats import FORMATS
    from wicore.api.tools.plan import ToolPlan, with_tool_grammar
    from wicore.api.tools.request import parse_tools
    from wicore.structured.spec import StructuredKind, StructuredOutput

    tools = parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert tools is not None
    plan = ToolPlan(FORMATS["hermes"], tools)
    assert with_tool_grammar(Options(), plan).structured == plan.structured()
    schema = StructuredOutput(StructuredKind.JSON, "{}", "response_format")
    with pytest.raises(APIError) as info:
        with_tool_grammar(Options(structured=schema), plan)
    assert info.value.status == 400 and info.value.param == "tool_choice"
    assert (
        str(info.value.message)
        == "tool_choice: naming get_weather makes the output tool calls; it cannot also follow response_format"
    )
