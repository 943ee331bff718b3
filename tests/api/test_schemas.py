"""Request parsing: defaults, unknown fields ignored, 400s that name the parameter."""

from __future__ import annotations

import pytest

from wicore.api.errors import APIError
from wicore.api.images import ImagePart
from wicore.api.schemas import Options, parse_chat, parse_completion

MSG = [{"role": "user", "content": "hi"}]


def test_defaults_and_unknown_fields_ignored():
    req = parse_chat({"messages": MSG, "model": "m", "some_future_field": {"x": 1}})
    assert req.options == Options(model="m")
    assert req.messages == [{"role": "user", "content": "hi"}]


def test_fields_are_read():
    req = parse_chat(
        {
            "messages": MSG,
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "seed": 3,
            "stop": "x",
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "priority": "high",
            "user": "u",
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "logprobs": False,
            "ignore_eos": True,
        }
    )
    assert req.options == Options(
        max_tokens=7,
        temperature=0.0,
        top_p=0.5,
        top_k=0,
        seed=3,
        stop=("x",),
        n=2,
        stream=True,
        include_usage=True,
        priority="high",
        user="u",
        ignore_eos=True,
    )


def test_nulls_mean_not_given():
    req = parse_completion({"prompt": "a", "max_tokens": None, "temperature": None, "stop": None, "n": None})
    assert req.options == Options() and req.prompts == ["a"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("max_tokens", "5"),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("top_p", 0),
        ("top_p", 1.1),
        ("top_k", -2),
        ("n", 0),
        ("n", 17),
        ("seed", "s"),
        ("stop", 3),
        ("stop", ["a", 1]),
        ("stream", "yes"),
        ("stream_options", 1),
        ("priority", "asap"),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("presence_penalty", "x"),
        ("logprobs", 2),
        ("top_logprobs", 2),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("user", 5),
        ("ignore_eos", "yes"),
    ],
)
def test_bad_values_name_the_parameter(field, value):
    with pytest.raises(APIError) as info:
        parse_chat({"messages": MSG, field: value})
    assert info.value.status == 400
    assert info.value.param == field
    assert field in info.value.message


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "frequency_penalty"])
def test_nan_is_out_of_range(field):
    # Python's json module reads the NaN literal, so `{"temperature": NaN}` arrives as float("nan").
    with pytest.raises(APIError) as info:
        parse_chat({"messages": MSG, field: float("nan")})
    assert (info.value.status, info.value.param) == (400, field)


@pytest.mark.parametrize("value", [6, -1, True, False, "3", 1.5])
def test_bad_completion_logprobs_name_the_parameter(value):
    with pytest.raises(APIError) as info:
        parse_completion({"prompt": "a", "logprobs": value})
    assert (info.value.status, info.value.param) == (400, "logprobs")


def test_top_logprobs_needs_logprobs_true():
    with pytest.raises(APIError, match="needs logprobs: true") as info:
        parse_chat({"messages": MSG, "logprobs": False, "top_logprobs": 3})
    assert info.value.param == "top_logprobs"


@pytest.mark.parametrize(
    "body, logprobs",
    [
        ({}, None),
        ({"logprobs": False, "top_logprobs": 0}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
    ],
)
def test_chat_logprobs(body, logprobs):
    assert parse_chat({"messages": MSG, **body}).options.logprobs == logprobs


@pytest.mark.parametrize("value, logprobs", [(None, None), (0, 0), (5, 5)])
def test_completion_logprobs(value, logprobs):
    assert parse_completion({"prompt": "a", "logprobs": value}).options.logprobs == logprobs


def test_penalties_are_read():
    opts = parse_completion({"prompt": "a", "presence_penalty": -2, "frequency_penalty": 1.5}).options
    assert (opts.presence_penalty, opts.frequency_penalty) == (-2.0, 1.5)


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0].image_url"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "messages[0].content[0].text"),
    ],
)
def test_bad_messages(messages, param):
    with pytest.raises(APIError) as info:
        parse_chat({"messages": messages})
    assert (info.value.status, info.value.param) == (400, param)


def test_content_parts_and_roles():
    req = parse_chat(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
            ]
        }
    )
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": ""},
    ]
    assert req.images == ()


def test_image_parts_stay_in_place_and_their_urls_are_collected():
    req = parse_chat(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:a"}}, {"type": "text", "text": "?"}],
                },
                {"role": "assistant", "content": "a cat"},
                {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image_url", "image_url": "data:b"}]},
            ]
        }
    )
    assert [m["content"] for m in req.messages] == [
        [{"type": "image"}, {"type": "text", "text": "?"}],
        "a cat",
        [{"type": "text", "text": "and"}, {"type": "image"}],
    ]
    assert req.images == (ImagePart("data:a", "messages[0].content[0]"), ImagePart("data:b", "messages[2].content[1]"))


@pytest.mark.parametrize(
    "prompt, expected",
    [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_prompt_forms(prompt, expected):
    assert parse_completion({"prompt": prompt}).prompts == expected


@pytest.mark.parametrize("prompt", [None, [], 3, ["a", 1], [[]], [True]])
def test_bad_prompts(prompt):
    with pytest.raises(APIError) as info:
        parse_completion({"prompt": prompt})
    assert info.value.param == "prompt"


def test_body_must_be_an_object():
    with pytest.raises(APIError) as info:
        parse_chat([1, 2])
    assert info.value.status == 400


def test_completion_priority_numbers():
    assert parse_completion({"prompt": "a", "priority": 3}).options.priority == "urgent"


USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [TOOL["function"]]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_legacy_functions_and_structured_output_are_refused_not_ignored(extra, param):
    with pytest.raises(APIError) as err:
        parse_chat({"messages": USER, **extra})
    assert err.value.status == 400 and err.value.param == param and err.value.code == "unsupported"


@pytest.mark.parametrize(
    "extra", [{"tools": []}, {"tools": None}, {"tool_choice": "none"}, {"response_format": {"type": "text"}}]
)
def test_their_off_values_pass(extra):
    assert parse_chat({"messages": USER, **extra}).messages[0]["content"] == "hi"
