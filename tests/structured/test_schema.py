"""Objects closed where a schema does not say otherwise (wicore/structured/schema.py), as vLLM's
xgrammar default and llama.cpp's converter generate: exact rewrites, and the grammar that follows."""

from __future__ import annotations

from wicore.structured.schema import close_objects


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
