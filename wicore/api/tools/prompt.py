"""The conversation as the chat template renders it, with the request's tools.

A template that takes `tools` (Llama 3.1, Qwen 2.5, Hermes ...) gets them as transformers'
`apply_chat_template(tools=...)` hands them, and the history as it is: assistant `tool_calls`
with their arguments as objects, `role: "tool"` messages.

A template that takes none (Gemma 3's, SmolLM2's) gets the format's prompt instead:

    system     its own text, then the format's instructions and the function list
               (Gemma's template folds the system text into the first user turn: Google's way)
    assistant  past calls written as the model writes them (`<tool_call>...`, `[f(a=1)]`)
    tool       results, consecutive ones in one user turn (`The tool returned: ...`, Gemma's ```tool_output)
"""

from __future__ import annotations

from typing import Any

from wicore.api.tools.formats import ToolFormat
from wicore.api.tools.request import ToolRequest
from wicore.api.tools.scan import Call


def template_inputs(
    messages: list[dict[str, Any]], tools: ToolRequest | None, fmt: ToolFormat, takes_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template."""
    if takes_tools:
        return messages, None if tools is None else [f.as_tool() for f in tools.functions]
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            results.append(_text(message.get("content")))
            continue
        if results:
            out.append({"role": "user", "content": fmt.render_results(results)})
            results = []
        calls = message.get("tool_calls")
        if message["role"] == "assistant" and calls:
            said = _text(message.get("content"))
            written = fmt.render_calls([Call(c["function"]["name"], c["function"]["arguments"]) for c in calls])
            out.append({"role": "assistant", "content": f"{said}\n{written}" if said else written})
        else:
            out.append(message)
    if results:
        out.append({"role": "user", "content": fmt.render_results(results)})
    if tools is not None:
        out = _with_instructions(out, fmt.instructions(tools.functions))
    return out, None


def _with_instructions(messages: list[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    """The instructions at the end of the system message (one is added where there is none)."""
    if messages and messages[0]["role"] == "system":
        system = _text(messages[0].get("content"))
        return [{**messages[0], "content": f"{system}\n\n{instructions}" if system else instructions}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def _text(content: Any) -> str:
    """A message content's text (its text parts joined)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""
