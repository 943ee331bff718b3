"""A choice's text pieces -> content pieces and tool-call deltas, in OpenAI's shapes.

    text pieces ──► ToolCallStream (the format's scan of all text so far) ──► pieces:
        Piece("", reasoning="The user asks...")                      reasoning (harmony's analysis channel)
        Piece("Let me check.")                                       content, as soon as it is final
        Piece("", tool_calls=[{"index": 0, "id": "call_…", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}])
        Piece("", tool_calls=[{"index": 0, "function": {"arguments": "{\\"city\\": \\"Paris\\"}"}}])
        Piece("", "tool_calls")                                      the finish ("stop" -> "tool_calls",
                                                                     unless tool_choice named the function)

Text that may begin a call is held back until the call is complete and parses (then its two
deltas go), or is known not to be one (then it goes as content). The non-streamed answer joins
the same pieces (`message`), so both always agree.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from wicore.api.generation import Piece
from wicore.api.logprobs import TokenLogprobs
from wicore.api.tools.plan import ToolPlan
from wicore.api.tools.scan import BracketMemo, Call


@dataclass(frozen=True)
class Released:
    """What one push made final: content, reasoning and calls (reasoning before content within a push)."""

    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)


class ToolCallStream:
    """The content and calls of one choice's text, as it grows."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self._text = ""
        self._sent = 0  # characters of text accounted for (sent as content, or as calls)
        self._memo: BracketMemo = {}  # where the scans of blocks still open stopped
        self.num_calls = 0

    def push(self, text: str, final: bool = False) -> Released:
        """Add generated text; return the content, reasoning and calls that became final."""
        self._text += text
        scan = self.plan.format.scan(self._text, final, self.plan.tools.names, self._memo)
        content = reasoning = ""
        calls: list[Call] = []
        for segment in scan.segments:
            if segment.end <= self._sent:
                continue
            if segment.calls:
                calls.extend(segment.calls)
            elif segment.is_reasoning:
                reasoning += self._text[max(segment.start, self._sent) : segment.end]
            else:
                content += self._text[max(segment.start, self._sent) : segment.end]
        self._sent = max(self._sent, scan.consumed)
        if not self.plan.tools.parallel:  # parallel_tool_calls: false keeps the first call
            calls = calls[: max(0, 1 - self.num_calls)]
        self.num_calls += len(calls)
        return Released(content, reasoning, calls)


async def tool_pieces(pieces: AsyncIterator[Piece], plan: ToolPlan) -> AsyncIterator[Piece]:
    """The pieces of a choice read for tool calls (see the module's diagram)."""
    stream = ToolCallStream(plan)
    logprobs: list[TokenLogprobs] = []
    try:
        async for piece in pieces:
            logprobs += piece.logprobs
            final = piece.finish_reason is not None
            released = stream.push(piece.text, final)
            calls = released.calls
            if released.content or released.reasoning:
                yield Piece(released.content, None, logprobs, reasoning=released.reasoning)
                logprobs = []
            for n, call in enumerate(calls):
                index = stream.num_calls - len(calls) + n
                head = {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
                yield Piece("", None, tool_calls=[{**head, "function": {"name": call.name, "arguments": ""}}])
                yield Piece("", None, tool_calls=[{"index": index, "function": {"arguments": call.arguments_json}}])
            if final:
                # OpenAI (and vLLM): "tool_calls" when the model chose to call; a named function's call ends with "stop"
                chose = stream.num_calls and plan.tools.named is None
                reason = "tool_calls" if chose and piece.finish_reason == "stop" else piece.finish_reason
                yield Piece("", reason, logprobs)
                return
    finally:  # left early (a client gone): the choice's own generator ends now, aborting its request
        await pieces.aclose()  # type: ignore[attr-defined]


def message(content: str, deltas: list[dict[str, Any]], reasoning: str = "") -> dict[str, Any]:
    """The non-streamed message of a choice whose pieces carried `content`, these tool-call deltas
    and `reasoning` (as vLLM's `reasoning_content`, present only when there was some)."""
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        if "id" in delta:
            calls.append({"id": delta["id"], "type": "function", "function": dict(delta["function"])})
        else:
            calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    thought = {"reasoning_content": reasoning} if reasoning else {}
    if not calls:
        return {"role": "assistant", "content": content, **thought}
    return {"role": "assistant", "content": content or None, **thought, "tool_calls": calls}
