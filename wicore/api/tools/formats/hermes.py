"""Hermes / Qwen 2.5 / ChatML calls: JSON inside <tool_call> tags, one call a block.

    Let me check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 1}}]   (a list: SmolLM2's way)
    </tool_call>

Text outside the blocks is content. A block whose JSON does not parse, or that calls an
undeclared function, stays content as written. The last block may lack its closing tag (the
model stopped after the JSON).
"""

from __future__ import annotations

import json

from wicore.api.tools.formats.base import ToolFormat, call_object_schema, json_rule, lark_string, tool_list
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan, call_from_object, whitespace_before

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        scan = Scan()
        pos = 0
        while True:
            i = text.find(OPEN, pos)
            if i < 0:
                scan.tail(text, pos, final, (OPEN,))
                return scan
            start = whitespace_before(text, pos, i)
            scan.content(pos, start)
            j = text.find(CLOSE, i)
            if j < 0 and not final:
                return scan
            body_end = j if j >= 0 else len(text)
            end = j + len(CLOSE) if j >= 0 else len(text)
            calls = _calls(text[i + len(OPEN) : body_end], names)
            if calls is None:
                scan.content(start, end)
            else:
                scan.calls(start, end, calls)
            pos = end

    def instructions(self, functions: tuple[Function, ...]) -> str:
        return (
            "# Tools\n\n"
            "You may call one or more functions to help with the user's request. "
            "The functions are described within <tools></tools> XML tags:\n"
            f"<tools>\n{tool_list(functions)}\n</tools>\n\n"
            "To call a function, reply with a JSON object of its name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_calls(self, calls: list[Call]) -> str:
        return "\n".join(
            f"{OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{CLOSE}" for c in calls
        )

    def render_results(self, results: list[str]) -> str:
        # Plain words rather than Qwen's <tool_response> tags: a template that takes no tools is a
        # model never shown them (SmolLM2-135M copies the tags back instead of answering)
        return "\n".join(f"The tool returned: {r}" for r in results)

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        more = ' ("\\n" call)*' if parallel else ""
        return (
            f"start: call{more}\n"
            f"call: {lark_string(OPEN + chr(10))} body {lark_string(chr(10) + CLOSE)}\n"
            f"body: {json_rule(call_object_schema(functions, 'arguments'))}\n"
        )


def _calls(body: str, names: frozenset[str]) -> list[Call] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item, names, ("arguments", "parameters")) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]
