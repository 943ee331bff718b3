"""Server-sent events: OpenAI's chunk shapes, choices merged in arrival order, `data: [DONE]`.

    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {...}}]}
    ...
    data: {"choices": [], "usage": {...}}      (stream_options.include_usage)
    data: [DONE]

A response that ends early (the client went away) closes its body iterator, which
cancels the choices and so aborts their requests in the engine. A server shutting down cuts
the streams still open shortly before its grace period ends (`Streams.cut`): each ends with
an error event and `[DONE]`, so a client can tell a cut answer from a finished one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from wicore.api.errors import APIError, from_wicore
from wicore.api.generation import Piece
from wicore.api.logprobs import LogprobFormatter
from wicore.errors import WiCoreError

log = logging.getLogger("wicore.api")

DONE = "data: [DONE]\n\n"
# One encoder for every event: json.dumps with options builds a new JSONEncoder a call (a quarter
# of an event's encoding time); encode() keeps no state between calls.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def sse(payload: dict[str, Any]) -> str:
    return f"data: {_COMPACT.encode(payload)}\n\n"


class TextChunk(dict):
    """A chunk whose one choice carries only text (no logprobs, no finish reason, no tool calls):
    most chunks of a stream. It is the chunk object all the same; `event_stream` writes its event
    from the text and the JSON around it, encoded once a stream (`_Templates`), not the whole
    object each time."""

    def __init__(self, payload: dict[str, Any], is_chat: bool, index: int, text: str) -> None:
        super().__init__(payload)
        self.is_chat, self.index, self.text = is_chat, index, text

    def with_text(self, text: str) -> dict[str, Any]:
        """This chunk as a plain dict with `text` in its text's place."""
        [choice] = self["choices"]
        field = {"delta": {**choice["delta"], "content": text}} if self.is_chat else {"text": text}
        return {**self, "choices": [{**choice, **field}]}


# A text no chunk's own fields hold (private-use characters, written raw): its encoding in a
# chunk splits the chunk's JSON into what comes before and after any text.
_MARK = "\ue000wicore-text\ue000"
_encode_text = json.encoder.encode_basestring  # what _COMPACT writes a string with (ensure_ascii=False)


class _Templates:
    """One stream's text chunks' JSON before and after the text, by choice index."""

    def __init__(self) -> None:
        self._around: dict[int, tuple[str, str]] = {}

    def sse(self, c: TextChunk) -> str:
        around = self._around.get(c.index)
        if around is None:
            before, _, after = _COMPACT.encode(c.with_text(_MARK)).rpartition(_encode_text(_MARK))
            around = self._around[c.index] = (f"data: {before}", f"{after}\n\n")
        return f"{around[0]}{_encode_text(c.text)}{around[1]}"


class EventStream(StreamingResponse):
    """A text/event-stream response that always closes its body iterator, even when the
    client disconnects while a chunk is being sent (Starlette then only cancels the send)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                await aclose()
            if self._on_close is not None:
                self._on_close()


class Streams:
    """The queues of the streams (and non-streamed answers) open now, so that a shutdown can end them
    (`cut`). A one-choice answer goes through a queue too: read in its response's own task it would
    save a task wakeup a piece, but then a cut could only end it when the engine's next output came,
    which a long step (or a stuck engine) holds past the grace period: the client lost its 503."""

    def __init__(self) -> None:
        self.open: set[asyncio.Queue] = set()

    def cut(self) -> None:
        """End every open stream with a 503 error event (call on the server's event loop)."""
        error = APIError(503, "the server is shutting down; the answer was cut short: retry", code="server_shutting_down")
        for queue in self.open:
            queue.put_nowait((-1, error))


async def merge(choices: list[AsyncIterator[Piece]], streams: Streams | None = None) -> AsyncIterator[tuple[int, Piece]]:
    """(choice index, piece) from all choices as they arrive; the first error is raised.

    Leaving early cancels the remaining choices (each aborts its engine request)."""
    queue: asyncio.Queue[tuple[int, Piece | Exception | None]] = asyncio.Queue()
    if streams is not None:
        streams.open.add(queue)

    async def drain(index: int, choice: AsyncIterator[Piece]) -> None:
        try:
            async for piece in choice:
                queue.put_nowait((index, piece))
            queue.put_nowait((index, None))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(drain(i, c)) for i, c in enumerate(choices)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        if streams is not None:
            streams.open.discard(queue)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def chunk(base: dict[str, Any], is_chat: bool, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {**base, "object": "chat.completion.chunk" if is_chat else "text_completion", "choices": choices}


async def chunks(
    base: dict[str, Any],
    is_chat: bool,
    choices: list[AsyncIterator[Piece]],
    usage: Any,
    include_usage: bool,
    logprobs: LogprobFormatter | None = None,
    streams: Streams | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The chunk objects of a streamed completion, in order (SSE here, WebSocket frames in
    wicore.api.websocket); an error is raised. `usage()` gives the final usage object; with
    `logprobs`, each chunk carries those of the tokens whose text it starts."""
    extra = {"usage": None} if include_usage else {}
    if is_chat:
        for i in range(len(choices)):
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            yield {**chunk(base, True, [role]), **extra}
    async for index, piece in merge(choices, streams):
        if is_chat:
            said = piece.text or (piece.finish_reason is None and not piece.reasoning)
            delta: dict[str, Any] = {"content": piece.text} if said else {}
            if piece.reasoning:  # vLLM's field for a reasoning model's thinking
                delta["reasoning_content"] = piece.reasoning
            if piece.tool_calls:
                delta = {**({"content": piece.text} if piece.text else {}), "tool_calls": piece.tool_calls}
            shaped = None if logprobs is None else logprobs.chat(piece.logprobs)
            choice = {"index": index, "delta": delta, "logprobs": shaped, "finish_reason": piece.finish_reason}
        else:
            shaped = None if logprobs is None else logprobs.completion(piece.logprobs)
            choice = {"index": index, "text": piece.text, "logprobs": shaped, "finish_reason": piece.finish_reason}
        payload = {**chunk(base, is_chat, [choice]), **extra}
        plain = piece.text and shaped is None and piece.finish_reason is None and not piece.reasoning and not piece.tool_calls
        yield TextChunk(payload, is_chat, index, piece.text) if plain else payload
    if include_usage:
        yield {**chunk(base, is_chat, []), "usage": usage()}


def stream_error(exc: Exception, stream_id: object) -> APIError:
    """What a client is told when its stream fails after it started: an APIError as it is, anything
    else (a bug) logged and told as a 500, so one failing stream ends and the server goes on."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, WiCoreError):  # an engine elsewhere refusing after the stream started (wicore.engine_process)
        return from_wicore(exc)
    log.error("stream %s failed", stream_id, exc_info=exc)
    return APIError(500, f"stream {stream_id} failed; see the server log", code="internal_error")


async def event_stream(chunk_objects: AsyncIterator[dict[str, Any]], stream_id: object) -> AsyncIterator[str]:
    """The SSE body of a streamed completion (its `chunks`); an error ends it with an error event."""
    templates = _Templates()
    try:
        async for c in chunk_objects:
            yield templates.sse(c) if type(c) is TextChunk else sse(c)
    except Exception as exc:
        yield sse(stream_error(exc, stream_id).body())
    yield DONE
