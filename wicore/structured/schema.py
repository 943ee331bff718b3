"""Object schemas closed where they do not say otherwise: what vLLM and llama.cpp generate.

JSON Schema lets an object carry properties it does not list unless `additionalProperties` says
no, and a grammar that follows the letter of it lets a small model append invented keys until
max_tokens (`{"color": "red", "data": {...`). vLLM's default backend (xgrammar's strict mode) and
llama.cpp's schema converter both allow only the listed properties unless `additionalProperties`
(or `unevaluatedProperties`) is given, so clients send such schemas expecting exactly the listed
keys. `close_objects` does the same: every subschema with `properties` or `patternProperties`
and neither keyword gets `"additionalProperties": false`. `{"type": "object"}` alone (JSON mode,
a free-form tool argument) stays open, and so does each branch of an `allOf` (closed, branches
listing different properties could not be met together).
"""

from __future__ import annotations

from typing import Any

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


def close_objects(schema: Any) -> Any:
    """A copy of `schema` with its objects closed as the module says (anything else as it is)."""
    return _close(schema, closable=True)


def _close(schema: Any, closable: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(sub, True) for name, sub in out[key].items()}
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key], True)
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_close(sub, True) for sub in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_close(sub, False) for sub in out["allOf"]]
    listed = "properties" in out or "patternProperties" in out
    if closable and listed and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out
