"""Pythonic calls (Llama 3.2 / 4's pythonic templates) and Gemma's (Google's function-calling prompt).

    [get_weather(city="Paris"), get_time(zone="CET")]
    ```tool_code
    [get_weather(city="Paris")]
    ```
    get_weather(city="Paris")           (a bare call of a declared function)

A list of calls (or one bare call) on a line of its own, keyword arguments only, values Python
or JSON literals (`True` and `true` alike), optionally in a ```tool_code / ```python fence.
Anything else stays content. Gemma differs only in its prompt: Google's documented instruction
in the first user turn (its chat template has no tools) and results in ```tool_output fences.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from wicore.api.tools.formats.base import ToolFormat, embedded, json_rule, lark_string
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan, python_end, scan_lines

FENCE = "```"
FENCE_LANGUAGES = ("", "tool_code", "python", "py")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
JSON_NAMES = {"true": True, "false": False, "null": None}


class Pythonic(ToolFormat):
    name = "pythonic"

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        return scan_lines(text, final, lambda t, i: _opens(t, i, names), lambda t, i, f: _block(t, i, f, names, memo))

    def instructions(self, functions: tuple[Function, ...]) -> str:
        tools = json.dumps([f.as_tool()["function"] for f in functions], ensure_ascii=False, indent=2)
        return (
            "You have access to functions. If you decide to invoke any of the function(s), you MUST put it in the format of\n"
            "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n\n"
            "You SHOULD NOT include any other text in the response if you call a function\n"
            f"{tools}"
        )

    def render_calls(self, calls: list[Call]) -> str:
        return "[" + ", ".join(f"{c.name}({', '.join(f'{k}={_python(v)}' for k, v in c.arguments.items())})" for c in calls) + "]"

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"The tool returned: {r}" for r in results)

    def check(self, functions: tuple[Function, ...]) -> None:
        for f in functions:
            if not IDENTIFIER.fullmatch(f.name):
                raise ValueError(f"{f.name!r} is not a Python identifier, which this model's call format (pythonic) needs")
            bad = next((p for p in (f.parameters.get("properties") or {}) if not IDENTIFIER.fullmatch(p)), None)
            if bad is not None:
                raise ValueError(f"{f.name}'s parameter {bad!r} cannot be a keyword argument (pythonic call format)")

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        more = ' (", " call)*' if parallel else ""
        rules = [f'start: "[" call{more} "]"', "call: " + " | ".join(f"f{i}" for i in range(len(functions)))]
        for i, f in enumerate(functions):
            rules += _call_rules(f, f"f{i}")
        return "\n".join(rules) + "\n"


class Gemma(Pythonic):
    """Google's prompt for Gemma function calling: the instruction and the function list in the
    user turn; the model answers with a Python list of calls; results come back fenced."""

    name = "gemma"

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"```tool_output\n{r}\n```" for r in results)


def _opens(text: str, i: int, names: frozenset[str]) -> bool | None:
    if len(text) - i < len(FENCE) and FENCE.startswith(text[i:]):
        return None
    if text.startswith(FENCE, i):
        newline = text.find("\n", i)
        if newline < 0:
            return None if text[i + 3 :].strip() in _prefixes(FENCE_LANGUAGES) else False
        if text[i + 3 : newline].strip() not in FENCE_LANGUAGES:
            return False
        i = newline + 1
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return None
    if text[i] == "[":
        rest = text[i + 1 :].lstrip()
        match = IDENTIFIER.match(rest)
        if not rest:
            return None
        if match is None:
            return False
        return None if match.end() == len(rest) else rest[match.end()] == "("
    match = IDENTIFIER.match(text, i)
    if match is None:
        return False
    if match.end() == len(text):
        return None if any(n.startswith(match.group()) for n in names) else False
    return text[match.end()] == "(" and match.group() in names


def _prefixes(words: tuple[str, ...]) -> set[str]:
    return {w[:n] for w in words for n in range(len(w) + 1)}


def _block(
    text: str, i: int, final: bool, names: frozenset[str], memo: BracketMemo | None
) -> tuple[int, list[Call] | None] | None:
    fenced = text.startswith(FENCE, i)
    if fenced:
        i = text.index("\n", i) + 1
        while text[i].isspace():
            i += 1
    if text[i] == "[":
        end = python_end(text, i, memo)
    else:
        match = IDENTIFIER.match(text, i)
        end = python_end(text, match.end(), memo) if match is not None else None
    if end is None:
        return None
    calls = _calls(text[i:end], names)
    if fenced:
        after = end
        while after < len(text) and text[after].isspace():
            after += 1
        if len(text) - after < 3 and not final and FENCE.startswith(text[after:]):
            return None
        if text.startswith(FENCE, after):
            end = after + 3
    return end, calls


def _calls(source: str, names: frozenset[str]) -> list[Call] | None:
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for item in items:
        if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id in names) or item.args:
            return None
        try:
            arguments = {k.arg: _literal(k.value) for k in item.keywords if k.arg is not None}
        except ValueError:
            return None
        if len(arguments) != len(item.keywords):
            return None  # **kwargs
        calls.append(Call(item.func.id, arguments))
    return calls or None


def _literal(node: ast.expr) -> Any:
    """A Python (or JSON) literal's value, JSON-shaped (tuples as lists)."""
    if isinstance(node, ast.Name) and node.id in JSON_NAMES:
        return JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    value = ast.literal_eval(node)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _key(node: ast.expr) -> str:
    key = _literal(node)
    if not isinstance(key, str):
        raise ValueError("dict keys must be strings")
    return key


def _python(value: Any) -> str:
    """A JSON value as a Python literal."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_python(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _call_rules(function: Function, rule: str) -> list[str]:
    """Lark rules of one call: keyword arguments in the schema's order, the required ones
    always, each optional one or not; every value a JSON literal of its property's schema."""
    parameters = function.parameters
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = [p for p in properties if p in (parameters.get("required") or [])]
    optional = [p for p in properties if p not in required]
    lines = []
    for n, p in enumerate(properties):
        schema, definition = embedded(parameters, "p", f"/properties/{p}")
        if definition is not None:
            schema = {**schema, "$defs": {"p": definition}}
        lines.append(f"{rule}_{n}: {lark_string(p + '=')} {json_rule(schema)}")
    index = {p: n for n, p in enumerate(properties)}
    head = ' ", " '.join(f"{rule}_{index[p]}" for p in required)
    if required:
        body = head + "".join(f' (", " {rule}_{index[p]})?' for p in optional)
    elif optional:
        # any ordered subset of the optional ones: o_k followed by later ones, or none of o_k
        for k, p in enumerate(optional):
            later = "".join(f' (", " {rule}_{index[q]})?' for q in optional[k + 1 :])
            skip = f" | {rule}_o{k + 1}" if k + 1 < len(optional) else ""
            lines.append(f"{rule}_o{k}: {rule}_{index[p]}{later}{skip}")
        body = f"{rule}_o0?"
    else:
        body = ""
    lines.insert(0, f"{rule}: {lark_string(function.name + '(')} {body} {lark_string(')')}".replace("  ", " "))
    return lines
