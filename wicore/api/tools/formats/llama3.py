"""Llama 3.1 / 3.2 JSON calls: a JSON object on a line of its own, several separated by `;`.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    {"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": 1}}

`<|python_tag|>` in front (a special token, usually decoded away) is skipped; `arguments` is
taken for `parameters`. A JSON object that is not a call of a declared function (an answer in
JSON) stays content.
"""

from __future__ import annotations

import json
import re

from wicore.api.tools.formats.base import ToolFormat, call_object_schema, json_rule, tool_list
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan, call_from_object, json_end, scan_lines

PYTHON_TAG = "<|python_tag|>"
CALL_START = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)"?')  # up to the name (the closing quote once there)
CALL_START_PREFIX = re.compile(r'\{\s*("(n(a(m(e("\s*(:\s*)?)?)?)?)?)?)?')  # text too short to tell


class Llama3Json(ToolFormat):
    name = "llama3_json"

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        return scan_lines(text, final, lambda t, i: _opens(t, i, names), lambda t, i, f: _block(t, i, f, names, memo))

    def instructions(self, functions: tuple[Function, ...]) -> str:
        return (
            "You have access to the following functions. To call one, reply with a JSON object of the form "
            '{"name": function name, "parameters": dictionary of argument name and its value}, and nothing else. '
            "Do not use variables.\n\n"
            f"{tool_list(functions)}"
        )

    def render_calls(self, calls: list[Call]) -> str:
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"The tool returned: {r}" for r in results)

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        more = ' ("; " body)*' if parallel else ""
        return f"start: body{more}\nbody: {json_rule(call_object_schema(functions, 'parameters'))}\n"


def _opens(text: str, i: int, names: frozenset[str]) -> bool | None:
    """A line opens a call with the tag, or with `{"name": "<a declared name>"` (name first, as
    Llama writes calls): other JSON is content as soon as it shows, not held to its end."""
    rest = text[i : i + len(PYTHON_TAG)]
    if rest == PYTHON_TAG:
        return True
    if not rest.startswith("{"):
        return None if PYTHON_TAG.startswith(rest) else False
    match = CALL_START.match(text, i)
    if match is None:
        return None if CALL_START_PREFIX.fullmatch(text, i) else False
    name = match.group(1)
    if match.end() == len(text):  # the name may go on
        return None if any(n.startswith(name) for n in names) else False
    return name in names


def _block(
    text: str, i: int, final: bool, names: frozenset[str], memo: BracketMemo | None
) -> tuple[int, list[Call] | None] | None:
    if text.startswith(PYTHON_TAG, i):
        i += len(PYTHON_TAG)
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return None
        if text[i] != "{":
            return i, None
    calls: list[Call] = []
    while True:
        end = json_end(text, i, memo)
        if end is None:
            return None
        try:
            call = call_from_object(json.loads(text[i:end]), names, ("parameters", "arguments"))
        except ValueError:
            call = None
        if call is None:
            return end, None
        calls.append(call)
        after = _skip_space(text, end)
        if after < len(text) and text[after] == ";":
            end = after + 1
            after = _skip_space(text, end)
            if after < len(text) and text[after] == "{":
                i = after
                continue
        if after == len(text) and not final:
            return None  # a `;` and another call may follow
        return end, calls


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
