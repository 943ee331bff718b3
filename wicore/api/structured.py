"""The request fields that constrain the output, parsed into one StructuredOutput (or None).

    response_format   {"type": "text"}                              (no constraint)
                      {"type": "json_object"}                       any JSON object
                      {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    structured_outputs {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": ...}
                      | {"json_object": true}                       (vLLM; structural_tag is a 400,
                                                                     its whitespace options are WiCore's own)
    guided_json, guided_regex, guided_choice, guided_grammar        (vLLM's older names)

At most one of them may constrain a request. Whether the constraint compiles is the engine's to say
(at admission: a 400 naming the field, wicore.errors.StructuredOutputError).
"""

from __future__ import annotations

import json
from typing import Any

from wicore.api.errors import APIError
from wicore.structured.spec import StructuredKind, StructuredOutput

_KINDS = {
    "json": StructuredKind.JSON,
    "regex": StructuredKind.REGEX,
    "choice": StructuredKind.CHOICE,
    "grammar": StructuredKind.GRAMMAR,
}


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def parse_structured(body: dict[str, Any]) -> StructuredOutput | None:
    """The request's output constraint; a 400 naming the field when one is malformed or several are given."""
    found = [
        spec
        for spec in (
            _response_format(body.get("response_format")),
            _structured_outputs(body.get("structured_outputs")),
            *(_value(f"guided_{name}", kind, body.get(f"guided_{name}")) for name, kind in _KINDS.items()),
        )
        if spec is not None
    ]
    if len(found) > 1:
        fields = ", ".join(spec.field for spec in found)
        raise _bad(found[1].field, f"a request takes one output constraint, got {fields}")
    return found[0] if found else None


def _response_format(value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("response_format", 'expected an object such as {"type": "json_object"}')
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(StructuredKind.JSON_OBJECT, "", "response_format")
    if kind != "json_schema":
        raise _bad("response_format.type", f"{kind!r}: choose text, json_object or json_schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad("response_format.json_schema", "expected an object with name and schema")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad("response_format.json_schema.name", "expected a string")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("response_format.json_schema.strict", "expected a boolean")
    schema = spec.get("schema")
    if schema is None:  # OpenAI: optional; no schema is any JSON object
        return StructuredOutput(StructuredKind.JSON_OBJECT, "", "response_format.json_schema")
    return _json(schema, "response_format.json_schema.schema")


def _structured_outputs(value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("structured_outputs", 'expected an object such as {"json": {...}} or {"regex": "..."}')
    if value.get("structural_tag") is not None:  # a constraint: never dropped in silence
        raise _bad(
            "structured_outputs.structural_tag",
            "not supported by this server; give one of json, regex, choice, grammar (Lark or GBNF) or json_object",
        )
    found = [spec for name, kind in _KINDS.items() if (spec := _value(f"structured_outputs.{name}", kind, value.get(name)))]
    if value.get("json_object"):
        found.append(StructuredOutput(StructuredKind.JSON_OBJECT, "", "structured_outputs.json_object"))
    if len(found) > 1:
        raise _bad("structured_outputs", f"give one of json, regex, choice, grammar, json_object; got {len(found)}")
    return found[0] if found else None


def _value(field: str, kind: StructuredKind, value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if kind is StructuredKind.JSON:
        return _json(value, field)
    if kind is StructuredKind.CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise _bad(field, "expected a non-empty list of strings")
        return StructuredOutput(kind, json.dumps(value), field)
    if not isinstance(value, str) or not value:
        raise _bad(field, "expected a non-empty string")
    return StructuredOutput(kind, value, field)


def _json(schema: Any, field: str) -> StructuredOutput:
    """A JSON schema given as an object (or, as vLLM takes it, as JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise _bad(field, f"the schema is not JSON ({exc})") from None
    if not isinstance(schema, (dict, bool)):
        raise _bad(field, "expected a JSON schema (an object)")
    return StructuredOutput(StructuredKind.JSON, json.dumps(schema), field)
