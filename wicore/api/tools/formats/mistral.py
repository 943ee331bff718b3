"""Mistral's calls (its v3 tokenizer's format: Mistral 7B Instruct v0.3, Nemo, Small 22B, Ministral):
a JSON list of calls after the `[TOOL_CALLS]` token.

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": {}}]

`[TOOL_CALLS]` is a special token: decoded as text is decoded for content it is gone, so an answer
is read as calls where it opens (after whitespace, or after the token where a vocabulary writes it
as text) with a JSON list whose every item is a call of a declared function; any other answer,
a list of something else included, is content as written. While streaming, an answer that opens
with `[` is held until its list closes. Newer Mistral vocabularies (v11 on: `[TOOL_CALLS]NAME[ARGS]{...}`,
Mistral Small 3.2, Magistral) write calls as mistral_v11.py reads them.
"""

from __future__ import annotations

import json

from wicore.api.tools.formats.base import ToolFormat, call_object_schema, json_rule, lark_string, tool_list
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan, call_from_object, json_end

MARKER = "[TOOL_CALLS]"


class Mistral(ToolFormat):
    name = "mistral"

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        scan = Scan()
        start = _skip_space(text, 0)
        if text.startswith(MARKER, start):
            start = _skip_space(text, start + len(MARKER))
        elif not final and text[start:] and MARKER.startswith(text[start:]):
            return scan  # it may still become the marker
        if not final and start == len(text):
            return scan  # nothing but whitespace (and the marker) yet
        if text.startswith("[", start):
            end = json_end(text, start, memo)
            if end is None and not final:
                return scan  # the list is still being written
            calls = None if end is None else _calls(text[start:end], names)
            if end is not None and calls is not None:
                scan.calls(0, end, calls)
                scan.tail(text, end, final, ())
                return scan
        scan.tail(text, 0, final, ())
        return scan

    def instructions(self, functions: tuple[Function, ...]) -> str:
        return (
            "You can call these functions:\n"
            f"{tool_list(functions)}\n\n"
            'To call them, reply with a JSON list and nothing else: [{"name": function name, "arguments": {...}}]'
        )

    def render_calls(self, calls: list[Call]) -> str:
        return json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"The tool returned: {r}" for r in results)

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        more = f" ({lark_string(', ')} call)*" if parallel else ""
        return f'start: "[" call{more} "]"\ncall: {json_rule(call_object_schema(functions, "arguments"))}\n'


def _calls(body: str, names: frozenset[str]) -> list[Call] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    calls = [call_from_object(item, names, ("arguments", "parameters")) for item in value]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
