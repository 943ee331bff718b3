"""OpenAI's Responses API, `POST /v1/responses`, over the chat path: the OpenAI SDK's
`client.responses.create` and the agent frameworks built on it (the OpenAI Agents SDK, Codex).

    Responses body ──► chat_body() ──► API.prepare / start (templates, tools, constraints, engine)
                                                     │ pieces (text, tool-call deltas, reasoning)
    response object / typed events ◄── ResponseBuilder ◄┘

The request's `input` (a string, or items: messages with input_text / input_image parts,
function_call and function_call_output items) becomes the chat conversation, `instructions` its
system message, `tools` (flat function tools) and `tool_choice` the chat's, `text.format` its
response_format, `max_output_tokens` its max_tokens. The answer's output items are, in order, the
model's reasoning (where its tool format separates it), its message and its function calls.

Not served (a 400 naming the field): previous_response_id and conversation (nothing is stored;
send the whole conversation as `input`), background mode, and tools other than functions
(web_search, file_search, computer use, MCP). `store` is accepted and answered as false.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wicore.api.errors import APIError
from wicore.api.generation import Piece
from wicore.api.streaming import stream_error

if TYPE_CHECKING:
    from wicore.api.generation import Generation


def _bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


# Chat fields the translation writes -> the Responses fields they came from (for errors of the chat checks).
_FIELDS = {"max_tokens": "max_output_tokens", "response_format": "text.format"}
_PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty", "stop")


def chat_body(body: Any) -> tuple[dict[str, Any], list[str]]:
    """The chat completions body that asks what a Responses body asks, and where each of its messages
    came from ("instructions", "input[3]"); a 400 naming the field otherwise."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_value")
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise _bad(name, "nothing is stored on this server: send the whole conversation as input", "unsupported")
    if body.get("background"):
        raise _bad("background", "background responses are not supported", "unsupported")
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if body.get(k) is not None}
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions", "expected a string")
        messages.append({"role": "system", "content": instructions})
        origins.append("instructions")
    _messages(body.get("input"), messages, origins)
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _bad("metadata", "expected an object of strings")
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text")
    if text is not None:
        if not isinstance(text, dict):
            raise _bad("text", "expected an object")
        if text.get("format") is not None:
            chat["response_format"] = _format(text["format"])
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
    return chat, origins


def renamed(exc: APIError, origins: list[str]) -> APIError:
    """A chat check's error, naming the Responses field it is about (`origins`: chat_body's)."""
    param = exc.param or ""
    new = None
    if param.startswith("response_format.json_schema"):  # text.format holds the schema's fields itself
        new = "text.format" + param.removeprefix("response_format.json_schema")
    elif param.startswith("tools[") and ".function" in param:  # a Responses tool is the function itself
        new = param.replace(".function", "", 1)
    elif param.startswith("messages["):
        index, _, rest = param.removeprefix("messages[").partition("]")
        new = (origins[int(index)] if index.isdigit() and int(index) < len(origins) else "input") + rest
    elif param.partition(".")[0] in _FIELDS:
        head, sep, rest = param.partition(".")
        new = _FIELDS[head] + sep + rest
    if new is None:
        return exc
    message = exc.message.replace(param, new, 1) if exc.message.startswith(param) else exc.message
    return APIError(exc.status, message, param=new, code=exc.code, headers=exc.headers)


def _messages(items: Any, messages: list[dict[str, Any]], origins: list[str]) -> None:
    """Append the chat messages of `input`, and the item each came from, to `messages` and `origins`."""
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        origins.append("input")
        return
    if not isinstance(items, list) or not items:
        raise _bad("input", "expected a string or a non-empty list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "expected an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}.role", "expected user, system, developer or assistant")
            messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
            origins.append(where)
        elif kind == "function_call":
            function = {"name": _text(item, "name", where), "arguments": _text(item, "arguments", where)}
            call: dict[str, Any] = {"id": _text(item, "call_id", where), "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # a turn's parallel calls are one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                origins.append(where)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = json.dumps(output, ensure_ascii=False)
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", where), "content": output})
            origins.append(where)
        elif kind == "reasoning":
            continue  # the model's earlier thinking: not shown to it again, as chat drops reasoning_content
        else:
            raise _bad(f"{where}.type", f"{kind!r} items are not supported (message, function_call, function_call_output)")


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", "expected a string")
    return value


def _content(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "expected a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        else:
            raise _bad(f"{where}[{j}]", f"{kind!r} parts are not supported (input_text, input_image with an image_url)")
    return parts


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools", "expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(f"tools[{i}]", f"{kind!r} tools are not supported: only function tools", "unsupported")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # "auto", "none", "required"; anything else is the chat check's 400


def _format(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, dict):
        raise _bad("text.format", "expected an object")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt  # text, json_object; others are the chat check's 400


@dataclass
class _Item:
    kind: str  # "message", "function_call" or "reasoning"
    item: dict[str, Any]
    text: str = ""


@dataclass
class ResponseBuilder:
    """A response's output items from a choice's pieces, and the stream's events as they form."""

    base: dict[str, Any]  # the response object's fixed fields
    items: list[_Item] = field(default_factory=list)
    sequence: int = 0

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def feed(self, piece: Piece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.reasoning:
            events += self._append("reasoning", piece.reasoning)
        if piece.text:
            events += self._append("message", piece.text)
        for delta in piece.tool_calls:
            events += self._call(delta)
        return events

    def _open(self, kind: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close_last()
        self.items.append(_Item(kind, item))
        index = len(self.items) - 1
        events.append(self.event("response.output_item.added", output_index=index, item=dict(item)))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)
            )
        return events

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        last = self.items[-1] if self.items else None
        if last is None or last.kind != kind or last.item["status"] != "in_progress":
            prefix = {"message": "msg", "reasoning": "rs"}[kind]
            item: dict[str, Any] = {"id": f"{prefix}_{uuid.uuid4().hex}", "type": kind, "status": "in_progress"}
            item |= {"role": "assistant", "content": []} if kind == "message" else {"summary": [], "content": []}
            events += self._open(kind, item)
            last = self.items[-1]
        last.text += text
        index = len(self.items) - 1
        where = {"item_id": last.item["id"], "output_index": index, "content_index": 0, "delta": text}
        kind_event = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        events.append(self.event(kind_event, **where))
        return events

    def _call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        function = delta.get("function") or {}
        if "id" in delta:  # a new call
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta["id"],
                "name": function.get("name", ""),
                "arguments": "",
            }
            events += self._open("function_call", item)
        arguments = function.get("arguments") or ""
        if arguments and self.items and self.items[-1].kind == "function_call":
            last = self.items[-1]
            last.text += arguments
            index = len(self.items) - 1
            events.append(
                self.event("response.function_call_arguments.delta", item_id=last.item["id"], output_index=index, delta=arguments)
            )
        return events

    def _close_last(self) -> list[dict[str, Any]]:
        if not self.items or self.items[-1].item["status"] != "in_progress":
            return []
        last, index = self.items[-1], len(self.items) - 1
        last.item["status"] = "completed"
        item_id = last.item["id"]
        events = []
        if last.kind == "message":
            part = {"type": "output_text", "text": last.text, "annotations": []}
            last.item["content"] = [part]
            events.append(
                self.event("response.output_text.done", item_id=item_id, output_index=index, content_index=0, text=last.text)
            )
            events.append(
                self.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
            )
        elif last.kind == "reasoning":
            last.item["content"] = [{"type": "reasoning_text", "text": last.text}]
            events.append(
                self.event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0, text=last.text)
            )
        else:
            last.item["arguments"] = last.text
            events.append(
                self.event("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=last.text)
            )
        events.append(self.event("response.output_item.done", output_index=index, item=dict(last.item)))
        return events

    def response(self, status: str, usage: dict[str, Any] | None = None, reason: str | None = None) -> dict[str, Any]:
        """The response object: in_progress (no output yet), completed, or incomplete (max_output_tokens)."""
        output = [] if status == "in_progress" else [i.item for i in self.items]
        details = {"reason": reason} if status == "incomplete" and reason else None
        shaped = None if usage is None else _usage(usage)
        return {**self.base, "status": status, "output": output, "incomplete_details": details, "usage": shaped}

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """Close the open item; the final status and events (ending with response.completed / .incomplete)."""
        events = self._close_last()
        status = "incomplete" if finish_reason == "length" else "completed"
        final = self.response(status, usage, "max_output_tokens" if status == "incomplete" else None)
        events.append(self.event(f"response.{status}", response=final))
        return status, events


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def response_base(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The fields every response object of this request carries, echoing what was asked."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "error": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": (text or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "user": body.get("user"),
    }


async def events(
    gen: Generation, builder: ResponseBuilder, merged: AsyncIterator[tuple[int, Piece]]
) -> AsyncIterator[dict[str, Any]]:
    """The stream's events: created, in_progress, the items', then completed or incomplete."""
    yield builder.event("response.created", response=builder.response("in_progress"))
    yield builder.event("response.in_progress", response=builder.response("in_progress"))
    reason = None
    async for _, piece in merged:
        for event in builder.feed(piece):
            yield event
        reason = piece.finish_reason or reason
    for event in builder.finish(reason, gen.usage())[1]:
        yield event


def sse_event(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def event_stream(stream: AsyncIterator[dict[str, Any]], builder: ResponseBuilder) -> AsyncIterator[str]:
    """The SSE body; a failure after the stream started ends it with an `error` event."""
    try:
        async for event in stream:
            yield sse_event(event)
    except Exception as exc:
        error = stream_error(exc, builder.base["id"])
        yield sse_event(builder.event("error", code=error.code, message=error.message, param=error.param))
