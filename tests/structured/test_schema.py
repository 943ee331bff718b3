"""Objects closed and numbers bounded where a schema does not say otherwise
(wicore/structured/schema.py), as vLLM's xgrammar default and llama.cpp's converter generate: exact
rewrites, and the grammar that follows (on a real byte-level BPE tokenizer, tests/tiny_chat.py)."""

from __future__ import annotations

import json

import pytest
import tiny_chat

from wicore.structured.compiler import GrammarCompiler, vocabulary
from wicore.structured.schema import MAX_INTEGER, bound_numbers, close_objects
from wicore.structured.spec import StructuredKind, StructuredOutput


def test_an_object_that_lists_properties_allows_no_others_unless_it_says_so():
    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert close_objects(person) == {**person, "additionalProperties": False}
    for open_ in ({"additionalProperties": True}, {"additionalProperties": {"type": "integer"}}, {"unevaluatedProperties": True}):
        assert close_objects({**person, **open_}) == {**person, **open_}
    assert close_objects({"type": "object"}) == {"type": "object"}  # JSON mode: any object
    assert close_objects({"patternProperties": {"^x": {}}}) == {"patternProperties": {"^x": {}}, "additionalProperties": False}
    assert close_objects(True) is True and close_objects({}) == {}


def test_every_nested_schema_is_closed_and_a_property_named_like_a_keyword_is_a_property():
    inner = {"properties": {"v": {"type": "integer"}}}
    schema = {
        "properties": {"properties": {"type": "string"}, "child": inner, "list": {"items": inner}},
        "$defs": {"node": {"properties": {"kids": {"type": "array", "prefixItems": [inner]}}}},
        "anyOf": [inner, {"type": "null"}],
        "additionalProperties": inner,
    }
    closed = {**inner, "additionalProperties": False}
    assert close_objects(schema) == {
        "properties": {"properties": {"type": "string"}, "child": closed, "list": {"items": closed}},
        "$defs": {"node": {"properties": {"kids": {"type": "array", "prefixItems": [closed]}}, "additionalProperties": False}},
        "anyOf": [closed, {"type": "null"}],
        "additionalProperties": closed,
    }
    assert schema["properties"]["child"] == inner  # the caller's schema is left as it was


def test_the_branches_of_an_allof_stay_open_so_that_they_can_be_met_together():
    schema = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]}
    assert close_objects(schema) == schema
    nested = {"allOf": [{"properties": {"a": {"properties": {"x": {}}}}}]}
    assert close_objects(nested) == {"allOf": [{"properties": {"a": {"properties": {"x": {}}, "additionalProperties": False}}}]}


def test_an_unbounded_integer_or_number_gets_llama_cpp_like_digit_bounds():
    assert bound_numbers({"type": "integer"}) == {"type": "integer", "minimum": -(MAX_INTEGER), "maximum": MAX_INTEGER}
    assert bound_numbers({"type": "number"}) == {
        "type": "number",
        "exclusiveMinimum": -1e16,
        "exclusiveMaximum": 1e16,
        "multipleOf": 1e-10,
    }
    assert bound_numbers({"type": "integer", "minimum": 0}) == {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER}
    assert bound_numbers({"type": "number", "exclusiveMaximum": 1, "multipleOf": 0.5}) == {
        "type": "number",
        "exclusiveMaximum": 1,
        "multipleOf": 0.5,
        "exclusiveMinimum": -1e16,
    }
    assert bound_numbers({"type": ["integer", "null"], "maximum": 5}) == {
        "type": ["integer", "null"],
        "maximum": 5,
        "minimum": -(MAX_INTEGER),
    }
    for fixed in ({"type": "integer", "const": 3}, {"type": "number", "enum": [1.5, 2]}, {"type": "string"}, {}):
        assert bound_numbers(fixed) == fixed
    nested = {"properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "items": {"type": "integer", "maximum": 9}}
    assert bound_numbers(nested) == {
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "items": {"type": "integer", "maximum": 9, "minimum": -(MAX_INTEGER)},
    }


@pytest.fixture(scope="module")
def compiler() -> tuple[GrammarCompiler, object]:
    bpe = tiny_chat.train_tokenizer()
    return GrammarCompiler(vocabulary(bpe.to_str(), bpe.get_vocab_size(), [1]), bpe.get_vocab_size()), bpe


@pytest.mark.parametrize(
    ("schema", "text", "accepted"),
    [
        ({"type": "integer"}, "9999999999999998", True),  # 16 digits
        ({"type": "integer"}, "-9999999999999998", True),
        ({"type": "integer"}, "10000000000000000", False),  # 17
        ({"type": "integer"}, "0", True),
        ({"type": "number"}, "9999999999999999.5", True),
        ({"type": "number"}, "99999999999999999", False),
        ({"type": "number"}, "0.1234567891", True),  # 10 fraction digits
        ({"type": "number"}, "0.12345678912", False),  # 11
        ({"type": "number"}, "-12.25", True),
        ({"type": "number"}, "0", True),
        ({"type": "number"}, "100000", True),
        ({"type": "number"}, "1e5", False),  # a bounded number has no exponent
        ({"type": "integer", "maximum": 10**20}, "10000000000000000", True),  # the schema's own bound holds
        ({"type": "object", "properties": {"n": {"type": "number"}}}, '{"n": 3.3333333333}', True),
        ({"type": "object", "properties": {"n": {"type": "number"}}}, '{"n": 3.33333333333}', False),
        (None, '{"a": [1.5, "x", null, {"b": true}], "c": -7}', True),  # JSON mode: any object
        (None, '{"a": [12345678901234567]}', False),  # its numbers bounded too
        (None, "[1]", False),
    ],
)
def test_a_compiled_schema_caps_the_digits_of_its_numbers(compiler, schema, text, accepted):
    grammars, bpe = compiler
    spec = (
        StructuredOutput(StructuredKind.JSON_OBJECT)
        if schema is None
        else StructuredOutput(StructuredKind.JSON, json.dumps(schema))
    )
    state = grammars.start(spec)
    tokens = bpe.encode(text, add_special_tokens=False).ids
    valid = state.num_valid(tokens) == len(tokens)
    if valid:
        assert all(state.accept(t) for t in tokens)
    assert (valid and state.is_accepting) is accepted
