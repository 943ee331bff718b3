"""Mistral's calls from its v11 tokenizer on (Mistral Small 3.1 / 3.2, Magistral, Devstral): each
call is `[TOOL_CALLS]NAME[ARGS]{arguments}`, one after another, after any content.

    Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}
    ├─ content ─┤├─────────────── call ───────────────────────┤├────────────── call ───────────────┤

`[TOOL_CALLS]` and `[ARGS]` are special tokens: decoded as content is decoded they are gone, so the
text this format reads keeps them (`reads_special_tokens`). Calls run from the first `[TOOL_CALLS]`
to the end; a call of an undeclared NAME, or arguments that are no JSON object, make that run
content as written. While streaming, a call goes as its arguments close, and a suffix that may begin
`[TOOL_CALLS]` is held. The grammar for tool_choice writes the markers as text (llguidance names a
special token in a grammar by its id, which a format does not know); the text reads the same.
"""

from __future__ import annotations

import json

from wicore.api.tools.formats.base import ToolFormat, json_rule, lark_string, tool_list
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan, json_end, whitespace_before

CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
EOS = "</s>"  # the end-of-sequence token of every Mistral vocabulary


class MistralV11(ToolFormat):
    name = "mistral_v11"
    reads_special_tokens = True

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        end = text.find(EOS)  # the text ends there (decoded with special tokens, it is written)
        if end < 0:
            return _scan(text, final, names, memo)
        scan = _scan(text[:end], True, names, memo)
        scan.skip(len(text))
        return scan

    def instructions(self, functions: tuple[Function, ...]) -> str:
        return (
            "You can call these functions:\n"
            f"{tool_list(functions)}\n\n"
            f"To call one, reply with {CALLS} then its name, {ARGS} and its arguments as a JSON object, "
            f'e.g. {CALLS}get_weather{ARGS}{{"city": "Paris"}}; one such block a call.'
        )

    def render_calls(self, calls: list[Call]) -> str:
        return "".join(f"{CALLS}{c.name}{ARGS}{c.arguments_json}" for c in calls)

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"The tool returned: {r}" for r in results)

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        rules = [f"start: call{'+' if parallel else ''}", "call: " + " | ".join(f"call{i}" for i in range(len(functions)))]
        for i, f in enumerate(functions):
            rules.append(f"call{i}: {lark_string(CALLS + f.name + ARGS)} args{i}")
            rules.append(f"args{i}: {json_rule(f.parameters)}")  # its own root: its $refs hold
        return "\n".join(rules) + "\n"


def _scan(text: str, final: bool, names: frozenset[str], memo: BracketMemo | None) -> Scan:
    scan = Scan()
    first = text.find(CALLS)
    if first < 0:
        scan.tail(text, 0, final, (CALLS, EOS))
        return scan
    start = whitespace_before(text, 0, first)
    scan.content(0, start)
    i = first
    while text.startswith(CALLS, i):
        found = _call(text, i + len(CALLS), names, memo)
        if found is None and not final:
            return scan  # the call is still being written
        if found is None:
            break
        end, call = found
        if call is None:
            break
        scan.calls(start, end, [call])
        start = i = end
        after = _skip_space(text, end)
        if after == len(text) or (not final and CALLS.startswith(text[after:])):
            if final:
                scan.skip(len(text))  # whitespace after the last call
            return scan  # done, or another call may follow
        if text.startswith(CALLS, after):
            i = after
    scan.tail(text, start, final, (CALLS, EOS))
    return scan


def _call(text: str, i: int, names: frozenset[str], memo: BracketMemo | None) -> tuple[int, Call | None] | None:
    """(end, the call) of `NAME[ARGS]{...}` at text[i] (call None when it is none), or None while
    the text ends inside it."""
    args = text.find(ARGS, i)
    if args < 0:
        held = text[i:]
        return None if any((n + ARGS).startswith(held) for n in names) else (len(text), None)
    name = text[i:args]
    body = args + len(ARGS)
    if name not in names:
        return body, None
    if body == len(text):
        return None
    if text[body] != "{":
        return body, None
    end = json_end(text, body, memo)
    if end is None:
        return None
    try:
        arguments = json.loads(text[body:end])
    except ValueError:
        return end, None
    return (end, Call(name, arguments)) if isinstance(arguments, dict) else (end, None)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
