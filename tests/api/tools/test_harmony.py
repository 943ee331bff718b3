"""gpt-oss's harmony format on exact strings, whole and streamed, and against its own chat template."""

from __future__ import annotations

import pytest
from scripted import harmony_tokenizer
from streamed import NAMES, TIME, WEATHER, joined, releases, streamed

from wicore.api.tools.formats import FORMATS, format_for_template
from wicore.api.tools.plan import ToolPlan, chat_prompt
from wicore.api.tools.request import ToolRequest
from wicore.api.tools.scan import Call
from wicore.api.tools.stream import Released, ToolCallStream

HARMONY = FORMATS["harmony"]
PARIS = Call("get_weather", {"city": "Paris"})
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"


def split(text: str, step: int = 1000) -> tuple[str, str, list[Call]]:
    """(content, reasoning, calls) of the whole text, pushed `step` characters at a time."""
    out = [r for _, r in releases("harmony", text, step)]
    return "".join(r.content for r in out), "".join(r.reasoning for r in out), [c for r in out for c in r.calls]


@pytest.mark.parametrize(
    ("text", "content", "reasoning", "calls"),
    [
        (THINK + FINAL, "It is sunny.", "The user wants the weather.", []),
        (THINK + CALL, "", "The user wants the weather.", [PARIS]),
        ("<|channel|>final<|message|>Hi!<|return|>", "Hi!", "", []),
        # the recipient in the role header, the content type without <|constrain|>
        (
            '<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>',
            "",
            "x",
            [Call("get_time", {"zone": "CET"})],
        ),
        # a preamble on the commentary channel is content; two analysis messages are one reasoning
        (
            THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + THINK + CALL,
            "Checking.",
            "The user wants the weather.The user wants the weather.",
            [PARIS],
        ),
        # cut by max_tokens inside the reasoning, inside the answer
        ("<|channel|>analysis<|message|>Hmm, let", "", "Hmm, let", []),
        (THINK + "<|start|>assistant<|channel|>final<|message|>It is", "It is", "The user wants the weather.", []),
        # no channels at all (a model that does not write harmony): content as written
        ("Just text.", "Just text.", "", []),
        ("", "", "", []),
    ],
)
def test_split(text, content, reasoning, calls):
    assert split(text) == (content, reasoning, calls)
    assert HARMONY.parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize(
    "body",
    [
        '{"city": Paris}',  # not JSON
        "[1]",  # not an object
    ],
)
def test_a_malformed_call_is_content(body):
    text = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{body}<|call|>"
    assert split(text) == (body, "", [])


def test_an_undeclared_function_or_another_recipient_is_content():
    for recipient in ("functions.book_flight", "browser.search"):
        text = f'<|channel|>commentary to={recipient} <|constrain|>json<|message|>{{"q": 1}}<|call|>'
        assert split(text) == ('{"q": 1}', "", [])


@pytest.mark.parametrize("step", [1, 2, 5, 13, 1000])
def test_streamed_in_pieces_adds_up_to_the_whole(step):
    text = THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + CALL
    assert split(text, step) == ("Checking.", "The user wants the weather.", [PARIS])


def test_reasoning_and_content_stream_as_written_and_a_call_when_it_closes():
    # one special token arrives as one piece: the decoder writes it whole
    pieces = ["<|channel|>", "analysis", "<|message|>", "Hmm", ".", "<|end|>", "<|start|>", "assistant", "<|channel|>"]
    pieces += [
        "commentary to=functions.get_weather ",
        "<|constrain|>",
        "json",
        "<|message|>",
        '{"city": ',
        '"Paris"}',
        "<|call|>",
    ]
    stream = ToolCallStream(ToolPlan(HARMONY, ToolRequest((WEATHER, TIME))))
    out = [stream.push(p) for p in pieces] + [stream.push("", final=True)]
    assert out == [Released()] * 3 + [Released(reasoning="Hmm"), Released(reasoning=".")] + [Released()] * 10 + [
        Released(calls=[PARIS]),
        Released(),
    ]


def test_a_possible_end_token_is_held_back():
    # "<|e" may begin <|end|>: held until the text ends without it
    text = "<|channel|>final<|message|>a <|e"
    assert releases("harmony", text, 1) == [
        (len(text) - 4, Released(content="a")),
        (len(text) - 3, Released(content=" ")),
        (len(text), Released(content="<|e")),
    ]


def test_parallel_false_keeps_the_first_call():
    text = CALL + CALL.replace("Paris", "Oslo")
    assert joined(streamed("harmony", text, parallel=False)) == ("", [PARIS])


def test_the_template_implies_harmony_and_its_rendered_call_parses_back(tmp_path):
    """The chat template's own rendering of a past call is what the parser reads as that call."""
    tok = harmony_tokenizer(tmp_path)
    assert format_for_template(tok.info.chat_template) is HARMONY
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt, plan = chat_prompt(tok, history, ToolRequest((WEATHER,)), HARMONY)  # (its template needs a description)
    assert plan is not None and plan.format is HARMONY
    assert "type get_weather = (_: {\ncity: string,\nunit?: any,\n}) => any;" in prompt  # the tools, as the template writes them
    turn = prompt.split("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")[1]
    written, result = turn.split("<|call|>")[0] + "<|call|>", turn.split("<|call|>")[1]
    assert written == ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    assert split(written) == ("", "", [PARIS])
    assert result == '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|><|start|>assistant'


def test_without_tools_the_answer_is_still_read_for_its_channels(tmp_path):
    tok = harmony_tokenizer(tmp_path)
    prompt, plan = chat_prompt(tok, [{"role": "user", "content": "Hi"}], None, HARMONY)
    assert prompt.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert plan == ToolPlan(HARMONY, ToolRequest(()))
    assert plan.structured() is None
