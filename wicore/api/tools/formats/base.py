"""The contract of a tool-call format: what one family of models writes when it calls a tool.

A format knows four things:

    scan(text, final, names)   the model's text -> content and calls (wicore.api.tools.scan)
    instructions(functions)    the system text that describes the tools, for a chat template
                               that takes no `tools` (Gemma 3's, SmolLM2's): the format's prompt
    render_calls / results     past calls and tool results, as text, for such a template
    grammar(functions, ...)    a Lark grammar (llguidance's dialect) of one or more calls:
                               tool_choice required / a named function is enforced with it
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan
from wicore.structured.schema import generation_schema


class ToolFormat(ABC):
    name: str = ""
    # The format's markers are special tokens (harmony's <|channel|>, Mistral v11's [TOOL_CALLS]):
    # the text it reads is decoded with them
    reads_special_tokens: bool = False
    # Every chat answer is read through the format, tools or not (harmony: its reasoning is never content)
    reads_every_answer: bool = False

    @abstractmethod
    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        """Split `text` (all generated so far) into content and calls of the declared `names`;
        `memo` (kept by a stream across scans of its growing text) saves rescanning long blocks."""

    @abstractmethod
    def instructions(self, functions: tuple[Function, ...]) -> str:
        """What the model is told about the tools when its chat template cannot say it."""

    @abstractmethod
    def render_calls(self, calls: list[Call]) -> str:
        """Past calls as the model would have written them."""

    @abstractmethod
    def render_results(self, results: list[str]) -> str:
        """Tool results (in the order of the calls) as the text of one user turn."""

    @abstractmethod
    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        """A Lark grammar whose every sentence is one call (or, with `parallel`, several) of `functions`."""

    def check(self, functions: tuple[Function, ...]) -> None:
        """Raise ValueError (naming the tool) if a function cannot be written in this format."""
        return None  # every format but pythonic writes any name and parameter

    def parse(self, text: str, names: frozenset[str]) -> tuple[str, list[Call]]:
        """The whole output's content and calls (its reasoning left out)."""
        scan = self.scan(text, True, names)
        content = "".join(text[s.start : s.end] for s in scan.segments if not s.calls and not s.is_reasoning)
        return content, [c for s in scan.segments for c in s.calls]


def lark_string(text: str) -> str:
    """A Lark string literal of `text`."""
    return json.dumps(text, ensure_ascii=False)


# JSON written as json.dumps writes it (and as the prompts show calls): no free whitespace for a
# small model to run on in, one way to write each call
CANONICAL_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def json_rule(schema: dict[str, Any]) -> str:
    """An inline JSON schema (llguidance's `%json {...}`), its JSON written canonically and its
    objects holding only the properties they list and its numbers bounded unless the schema says
    otherwise (wicore/structured/schema.py)."""
    return "%json " + json.dumps({**generation_schema(schema), "x-guidance": CANONICAL_JSON}, ensure_ascii=False)


def call_object_schema(functions: tuple[Function, ...], arguments_key: str) -> dict[str, Any]:
    """The schema of {"name": <one of functions>, <arguments_key>: <its parameters>}."""
    defs: dict[str, Any] = {}
    options = []
    for i, f in enumerate(functions):
        parameters, defs[f"f{i}"] = embedded(f.parameters, f"f{i}")
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": f.name}, arguments_key: parameters},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    defs = {k: v for k, v in defs.items() if v is not None}
    return {**schema, "$defs": defs} if defs else schema


def embedded(schema: dict[str, Any], name: str, path: str = "") -> tuple[dict[str, Any], Any]:
    """(the schema at `path` inside `schema`, the definition to put at $defs/`name` of the root it
    is embedded in, or None). A schema whose `$ref`s point into itself ("#/$defs/...") keeps them
    right by moving whole under $defs/`name`, its refs rebased there; others embed as they are."""
    if not _has_ref(schema):
        return (_at(schema, path), None)
    base = f"#/$defs/{name}"
    return ({"$ref": base + path}, _rebased(schema, base))


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    for part in path.strip("/").split("/") if path else ():
        schema = schema[part]
    return schema if isinstance(schema, dict) else {}


def _has_ref(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k == "$ref" or _has_ref(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_ref(v) for v in value)


def _rebased(value: Any, base: str) -> Any:
    if isinstance(value, dict):
        return {
            k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebased(v, base)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_rebased(v, base) for v in value]
    return value


def tool_list(functions: tuple[Function, ...]) -> str:
    """The functions as the JSON list a tools prompt shows (one tool object a line)."""
    return "\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in functions)
