"""One choice of one request: token ids in, text pieces out, stop strings cut exactly.

    engine outputs ──► IncrementalDecoder ──► StopMatcher ──► Piece(text, finish_reason)

While streaming, text that could be the start of a stop string is held back until the
next tokens show whether it is one; when a stop string completes, the text before it is
sent, the request is aborted in the engine, and the choice ends with "stop". Token
logprobs, when asked for, travel with the piece that carries their text (wicore.api.logprobs).

A request as a whole: `Job` (checked and tokenized: API.prepare) -> `Generation` (its choices
queued in the engine: API.start), answered over HTTP (app.py) or a WebSocket (websocket.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from wicore.api.errors import APIError
from wicore.api.logprobs import LogprobFormatter, LogprobQueue, TokenLogprobs
from wicore.api.schemas import Options
from wicore.api.serving import ServingEngine
from wicore.api.tools.plan import ToolPlan
from wicore.inputs.tokenizer import IncrementalDecoder
from wicore.types.images import ImageInput

log = logging.getLogger("wicore.api")


class StopMatcher:
    """Holds back text that may begin a stop string; finds the first stop string that completes."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to send, whether a stop string completed)."""
        if not self.stops:
            return text, False
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            return out, True
        hold = self._held_length()
        out, self._pending = self._pending[: len(self._pending) - hold], self._pending[len(self._pending) - hold :]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

    def _held_length(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop string."""
        text = self._pending
        for n in range(min(len(text), max((len(s) for s in self.stops), default=0) - 1), 0, -1):
            suffix = text[-n:]
            if any(s.startswith(suffix) for s in self.stops):
                return n
        return 0


@dataclass
class Piece:
    text: str
    finish_reason: str | None = None  # set on the last piece
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # the tokens whose text begins here
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's tool-call deltas (wicore.api.tools)
    reasoning: str = ""  # the model's reasoning, apart from its content (`reasoning_content`; wicore.api.tools)


@dataclass
class ChoiceStats:
    """Exact counts and timings of one choice, filled in while it runs."""

    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    token_times: list[float] = field(default_factory=list)


_REASONS = {"stop": "stop", "length": "length", "deadline": "length", "abort": "abort"}


async def run_choice(
    engine: ServingEngine,
    request_id: str,
    prompt_ids: list[int],
    stops: tuple[str, ...],
    stats: ChoiceStats,
    keep_special_tokens: bool = False,
    on_end: Callable[[ChoiceStats], None] | None = None,
) -> AsyncIterator[Piece]:
    """Yield the text pieces of request `request_id` (queued in `engine`, prompt `prompt_ids`);
    the last one carries the finish reason. `keep_special_tokens`: the text has them written (for
    a format whose markers they are: harmony's channels).

    Closing the generator early (a client that went away) aborts the request in the engine.
    `on_end(stats)` once the choice ended, however it did (the server's metrics; a callback, not
    a generator around this one: each layer costs every piece of every stream a resume).
    """
    decoder = IncrementalDecoder(engine.tokenizer, not keep_special_tokens, prompt_ids)
    matcher = StopMatcher(stops)
    queue = LogprobQueue()
    num_decoded = 0  # characters of text decoded so far
    num_sent = 0  # of those, sent (the rest is held back by the stop matcher)
    finished = False
    try:
        # An output holds one step's tokens, or several steps' when this stream fell behind
        # (wicore.engine.channel): then they become one piece.
        async for out in engine.outputs(request_id):
            now = time.monotonic()
            stats.num_cached_tokens = out.num_cached_tokens
            ids = out.new_token_ids
            text = ""  # safe to send
            if stops or out.logprobs is not None:
                # Token by token: a stop string ends the choice, and its count, at the token that
                # completes it, however many tokens came with it; logprobs need each token's offset.
                for i, token in enumerate(ids):
                    stats.num_completion_tokens += 1
                    stats.token_times.append(now)
                    if out.logprobs is not None:
                        queue.add(num_decoded, out.logprobs[i])
                    new = decoder.push(token)
                    num_decoded += len(new)
                    safe, stopped = matcher.push(new)
                    num_sent += len(safe)
                    text += safe
                    if stopped:  # tokens that begin inside the stop string go with it (finally aborts the rest)
                        yield Piece(text, "stop", queue.take(num_sent))
                        return
            else:  # the common case: no stops, no logprobs: two decodes for all the tokens
                stats.num_completion_tokens += len(ids)
                stats.token_times += [now] * len(ids)
                text = decoder.push_all(ids)
                num_decoded += len(text)
                num_sent += len(text)
            if out.finished:
                finished = True
                if out.finish_reason == "error":
                    log.error("request %s failed in the engine:\n%s", request_id, out.error)
                    raise APIError(
                        500, f"request {request_id} failed inside the engine; see the server log", code="internal_error"
                    )
                safe, stopped = matcher.push(decoder.flush())
                num_sent += len(safe)
                if stopped:
                    yield Piece(text + safe, "stop", queue.take(num_sent))
                    return
                yield Piece(text + safe + matcher.flush(), _REASONS.get(out.finish_reason or "stop", "stop"), queue.take_all())
                return
            if text:
                yield Piece(text, None, queue.take(num_sent))
    finally:
        if not finished:
            engine.abort(request_id)
        if on_end is not None:
            on_end(stats)


@dataclass(frozen=True)
class Job:
    """A checked request: each prompt's token ids, the options, the images that go with every prompt."""

    is_chat: bool
    prompts: list[list[int]]
    options: Options
    images: list[ImageInput] = field(default_factory=list)
    tools: ToolPlan | None = None  # a chat request's tools: its output is read for calls (wicore.api.tools)


@dataclass(frozen=True)
class Generation:
    """A job's choices, queued in the engine. Reading `choices` runs them; `abort()` ends them all
    (call it however the answer ends); `usage()` counts what has run so far."""

    base: dict[str, Any]  # id, created, model: the fields every chunk and answer carries
    is_chat: bool
    choices: list[AsyncIterator[Piece]]
    usage: Callable[[], dict[str, Any]]
    abort: Callable[[], None]
    logprobs: LogprobFormatter | None
