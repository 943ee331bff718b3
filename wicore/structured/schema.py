"""A JSON schema as WiCore generates it: objects closed and numbers bounded where the schema does
not say otherwise, the habits of vLLM's and llama.cpp's converters (`generation_schema`).

Closed objects: JSON Schema lets an object carry properties it does not list unless
`additionalProperties` says no, and a grammar that follows the letter of it lets a small model
append invented keys until max_tokens (`{"color": "red", "data": {...`). vLLM's default backend
(xgrammar's strict mode) and llama.cpp's schema converter both allow only the listed properties
unless `additionalProperties` (or `unevaluatedProperties`) is given, so clients send such schemas
expecting exactly the listed keys. `close_objects` does the same: every subschema with `properties`
or `patternProperties` and neither keyword gets `"additionalProperties": false`. `{"type": "object"}`
alone (JSON mode, a free-form tool argument) stays open, and so does each branch of an `allOf`
(closed, branches listing different properties could not be met together).

Bounded numbers: an `integer` or `number` with no bound lets a small model write digits until
max_tokens (`"age": 3333333333333...`); llguidance has no digit cap. llama.cpp's converter caps the
integral part at 16 digits and the fraction at 16. `bound_numbers` writes the cap as schema
keywords llguidance compiles to a bounded regex, on each side the schema leaves open:

    integer   minimum -MAX_INTEGER, maximum MAX_INTEGER            at most 16 digits
    number    exclusiveMinimum -1e16, exclusiveMaximum 1e16      at most 16 integral digits
              multipleOf 1e-10 (unless it gives one)             at most 10 fraction digits

Every value inside those bounds stays accepted; a bounded number is written without an exponent
(`100000`, not `1e5`). The fraction's cap is 10 digits, not llama.cpp's 16: llguidance reads
`multipleOf` through a float and refuses 1e-11 and finer. llguidance reads bounds as floats too, so
the integer bound is 9,999,999,999,999,998 (10**16 - 1 is no float). A schema with `const` or `enum`
is left as it is (its values are already fixed). JSON mode (`json_object`) is `JSON_OBJECT`, any
object spelled out so that its numbers are bounded too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_INTEGER_DIGITS = 16
MAX_FRACTION_DIGITS = 10  # llguidance's finest multipleOf (module docstring)
MAX_INTEGER = 10**MAX_INTEGER_DIGITS - 2  # the largest 16-digit float

# Any JSON object, every value kind written out (so that bound_numbers reaches its numbers)
_ANY_VALUE = {"$ref": "#/$defs/value"}
JSON_OBJECT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": _ANY_VALUE,
    "$defs": {
        "value": {
            "anyOf": [
                {"type": "null"},
                {"type": "boolean"},
                {"type": "number"},
                {"type": "string"},
                {"type": "array", "items": _ANY_VALUE},
                {"type": "object", "additionalProperties": _ANY_VALUE},
            ]
        }
    },
}

_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
)  # a schema (or a boolean)
_LISTS = ("anyOf", "oneOf", "prefixItems", "items")  # lists of schemas


def generation_schema(schema: Any) -> Any:
    """`schema` as WiCore generates it: a copy with its objects closed and its numbers bounded."""
    return bound_numbers(close_objects(schema))


def close_objects(schema: Any) -> Any:
    """A copy of `schema` with its objects closed as the module says (anything else as it is)."""
    return _close(schema, closable=True)


def bound_numbers(schema: Any) -> Any:
    """A copy of `schema` with each integer and number bounded as the module says."""
    return _rewrite(schema, lambda sub, _: _bound(sub))


def _rewrite(schema: Any, leaf: Callable[[dict[str, Any], bool], dict[str, Any]], closable: bool = True) -> Any:
    """A copy of `schema` with `leaf(subschema, closable)` applied to every subschema, inner ones
    first (`closable`: False for the branches of an allOf)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _rewrite(sub, leaf) for name, sub in out[key].items()}
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _rewrite(out[key], leaf)
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_rewrite(sub, leaf) for sub in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_rewrite(sub, leaf, closable=False) for sub in out["allOf"]]
    return leaf(out, closable)


def _close(schema: Any, closable: bool) -> Any:
    def leaf(out: dict[str, Any], closable: bool) -> dict[str, Any]:
        listed = "properties" in out or "patternProperties" in out
        if closable and listed and "additionalProperties" not in out and "unevaluatedProperties" not in out:
            out["additionalProperties"] = False
        return out

    return _rewrite(schema, leaf, closable)


def _bound(out: dict[str, Any]) -> dict[str, Any]:
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if not types & {"integer", "number"} or "const" in out or "enum" in out:
        return out
    if "number" in types:
        low: dict[str, Any] = {"exclusiveMinimum": -(10.0**MAX_INTEGER_DIGITS)}
        high: dict[str, Any] = {"exclusiveMaximum": 10.0**MAX_INTEGER_DIGITS}
        if "multipleOf" not in out:
            out["multipleOf"] = float(f"1e-{MAX_FRACTION_DIGITS}")
    else:
        low, high = {"minimum": -MAX_INTEGER}, {"maximum": MAX_INTEGER}
    if "minimum" not in out and "exclusiveMinimum" not in out:
        out.update(low)
    if "maximum" not in out and "exclusiveMaximum" not in out:
        out.update(high)
    return out
