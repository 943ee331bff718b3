"""Structured output through a real server on real models (slow layer): the official openai
client's `chat.completions.parse(response_format=<pydantic model>)`, streamed and not, greedy and
sampled, on SmolLM2-135M-Instruct and Gemma 3 270M, and LangChain's `with_structured_output`.
Every answer must parse into the model class (pydantic checks it against the schema).

Strings have a maxLength: a constraint keeps the text valid, not short, and a 270M base model can
run a free string to max_tokens. A number without bounds gets llama.cpp-like digit caps
(wicore/structured/schema.py): the last test checks that SmolLM2 stops in them."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Annotated

import pytest
from pydantic import BaseModel, Field
from served_app import start

from wicore.api.app import ServerSettings
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

pytestmark = pytest.mark.slow


class Unit(str, Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Address(BaseModel):
    city: str = Field(max_length=24)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):  # a nested object, an integer range, an optional field
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    address: Address
    nickname: str | None = Field(default=None, max_length=12)


class Forecast(BaseModel):  # an enum, an array with minItems, integer ranges
    city: str = Field(max_length=24)
    unit: Unit
    highs: list[int] = Field(min_length=2, max_length=5)
    days: int = Field(ge=1, le=7)


class Tags(BaseModel):  # an array of strings with minItems, a pattern, an optional integer range
    tags: list[Annotated[str, Field(max_length=16)]] = Field(min_length=1, max_length=4)
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    priority: int | None = Field(default=None, ge=1, le=5)


CASES = [
    (Person, "Describe a fictional person who lives in Paris."),
    (Forecast, "Give a weather forecast for Rome."),
    (Tags, "Tag this sentence: the quick brown fox jumps over the lazy dog."),
]
MODES = [
    dict(temperature=0.0, stream=False),
    dict(temperature=0.0, stream=True),
    dict(temperature=0.9, seed=7, stream=False),
    dict(temperature=0.9, seed=8, stream=True),
]


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def served(request, smollm2, gemma_270m):
    folder = smollm2() if request.param.startswith("smollm2") else gemma_270m(1)
    template = None if request.param.startswith("smollm2") else GEMMA3_CHAT_TEMPLATE  # the 270M is a base model
    s = start(folder, ServerSettings(model_name=request.param, chat_template=template), num_device_blocks=512)
    yield request.param, s
    s.server.stop()
    s.engine.stop()


def parse(client, model: str, schema: type[BaseModel], prompt: str, stream: bool, **sampling):
    messages = [{"role": "user", "content": prompt}]
    if stream:
        with client.chat.completions.stream(
            model=model, messages=messages, response_format=schema, max_tokens=400, **sampling
        ) as s:
            return s.get_final_completion()
    return client.chat.completions.parse(model=model, messages=messages, response_format=schema, max_tokens=400, **sampling)


@pytest.mark.parametrize(("schema", "prompt"), CASES, ids=[c[0].__name__ for c in CASES])
def test_openai_parse_returns_a_valid_instance_every_time(served, schema, prompt):
    from openai import OpenAI

    name, s = served
    client = OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=300)
    with ThreadPoolExecutor(len(MODES)) as pool:  # at once, as clients come: the engine batches them
        completions = list(pool.map(lambda mode: parse(client, name, schema, prompt, **mode), MODES))
    for mode, completion in zip(MODES, completions):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (mode, choice.message.content)
        assert isinstance(choice.message.parsed, schema), (mode, choice.message.content)


def test_langchain_with_structured_output(smollm2):
    from langchain_openai import ChatOpenAI

    s = start(smollm2(), ServerSettings(model_name="smollm2-135m-instruct"), num_device_blocks=512)
    try:
        llm = ChatOpenAI(base_url=f"{s.url}/v1", api_key="unused", model="smollm2-135m-instruct", temperature=0, max_tokens=300)
        with ThreadPoolExecutor(len(CASES)) as pool:  # at once: the engine batches them
            answers = list(pool.map(lambda case: llm.with_structured_output(case[0]).invoke(case[1]), CASES))
        for (schema, _), answer in zip(CASES, answers):
            assert isinstance(answer, schema), answer
        raw = llm.with_structured_output(Person, method="json_mode", include_raw=True).invoke(
            "Reply in JSON with the keys name, age and address (city, zip_code) of a person in Lyon."
        )
        assert raw["parsing_error"] is None or isinstance(raw["raw"].content, str)  # json_mode: any JSON object
    finally:
        s.server.stop()
        s.engine.stop()


@pytest.mark.parametrize(
    ("prompt", "value"),
    [
        ("What is pi to many decimal places? Reply in JSON.", 3.1415926535),
        ("Give the exact value of one third as a JSON number.", 1.3333333333),
    ],
)
def test_an_unbounded_number_stops_at_its_digit_cap(smollm2, prompt, value):
    """Without the cap (wicore/structured/schema.py) SmolLM2 writes these numbers' digits until max_tokens."""
    from openai import OpenAI

    s = start(smollm2(), ServerSettings(model_name="smollm2-135m-instruct"), num_device_blocks=64)
    try:
        client = OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=300)
        schema = {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}
        choice = client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
            max_tokens=80,
            temperature=0,
        ).choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert json.loads(choice.message.content or "") == {"value": value}
    finally:
        s.server.stop()
        s.engine.stop()
