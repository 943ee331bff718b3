"""`tools`, `tool_choice`, `parallel_tool_calls` and the tool fields of messages, checked.

    tools        [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]
    tool_choice  "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    messages     assistant {"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}
                 tool      {"role": "tool", "tool_call_id", "content"}

A 400 names the field (`tools[1].function.name`). Arguments of past calls arrive as JSON text
(OpenAI's shape) and are kept as objects, as chat templates expect them (transformers, vLLM).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from wicore.api.errors import APIError

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object
    description: str | None = None

    def as_tool(self) -> dict[str, Any]:
        """The OpenAI tool object, as chat templates take it in `tools`."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """The tools a chat request offers and how the model may use them."""

    functions: tuple[Function, ...]
    choice: str = "auto"  # none, auto, required, or "function": the one named in `named`
    named: str | None = None
    parallel: bool = True  # several calls in one answer (parallel_tool_calls; never for a named function)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.functions)

    @property
    def is_enforced(self) -> bool:
        """required or a named function: the output must be calls (a grammar makes it so)."""
        return self.choice in ("required", "function")

    def offered(self) -> tuple[Function, ...]:
        """The functions the model may call: the named one, or all."""
        return tuple(f for f in self.functions if self.named is None or f.name == self.named)


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools, or None when it offers none (or tool_choice is none)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "expected a list of tools")
    functions = tuple(_function(tool, f"tools[{i}]") for i, tool in enumerate(tools or []))
    if len(functions) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools, got {len(functions)}")
    names = [f.name for f in functions]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _bad("tools", f"two tools are named {duplicate!r}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", f"expected a boolean, got {type(parallel).__name__}")
    choice, named = _choice(body.get("tool_choice"), set(names))
    if not functions or choice == "none":
        return None
    return ToolRequest(functions, choice, named, parallel is not False and named is None)  # a named function: one call


def _function(tool: Any, where: str) -> Function:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise _bad(where, 'expected {"type": "function", "function": {"name": ..., "parameters": {...}}}')
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _bad(f"{where}.function.name", "expected 1 to 64 letters, digits, underscores or dashes")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.function.description", "expected a string")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise _bad(f"{where}.function.parameters", "expected a JSON schema object")
    return Function(name, parameters, description)


def _choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in CHOICES:
            raise _bad("tool_choice", f"{value!r}: choose none, auto, required or a function")
        if value == "required" and not names:
            raise _bad("tool_choice", "required needs tools")
        return value, None
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _bad("tool_choice", 'expected none, auto, required or {"type": "function", "function": {"name": ...}}')
    if name not in names:
        raise _bad("tool_choice", f"no tool is named {name!r}")
    return "function", name


def tool_message_fields(message: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    """The tool fields of one history message, checked: an assistant's `tool_calls` (arguments
    as objects), a tool result's `tool_call_id` (on other roles they must still be well-typed)."""
    call_id = message.get("tool_call_id")
    if (call_id is not None or role == "tool") and not isinstance(call_id, str):
        raise _bad(f"{where}.tool_call_id", "a tool message needs the id (a string) of the call it answers")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls", "expected a list of tool calls")
    checked = [_past_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls or [])]
    if role == "tool":
        return {"tool_call_id": call_id}
    return {"tool_calls": checked} if role == "assistant" and calls is not None else {}


def _past_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _bad(where, 'expected {"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}')
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise _bad(f"{where}.function.arguments", "expected a JSON object (as text)") from None
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.function.arguments", "expected a JSON object (as text)")
    call_id = call.get("id")
    if (call_id is not None and not isinstance(call_id, str)) or call.get("type") not in (None, "function"):
        raise _bad(where, 'expected {"id": "<string>", "type": "function", "function": {...}}')
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
