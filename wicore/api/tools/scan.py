"""What a tool-call parser returns, and the text helpers the formats share.

A parser reads the whole text generated so far and splits it into segments, in order:

    "Let me look.\\n<tool_call>\\n{...}\\n</tool_call>"      (text so far)
     ├─ Content ──┤├─ Calls (its whitespace included) ─┤
                                                    └─ consumed: everything before it is final

Text past `consumed` is undecided (it may begin a call, or be the whitespace before one) and is
held back; with `final=True` everything is consumed. Segments before `consumed` never change as
more text arrives, so a stream can send them at once (wicore.api.tools.stream).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Segment:
    """text[start:end]: content when `calls` is empty, else those calls (a malformed call is content);
    reasoning (`is_reasoning`, a model's thinking: OpenAI's `reasoning_content`) is neither."""

    start: int
    end: int
    calls: tuple[Call, ...] = ()
    is_reasoning: bool = False


@dataclass
class Scan:
    segments: list[Segment] = field(default_factory=list)
    consumed: int = 0

    def content(self, start: int, end: int) -> None:
        if end > start:
            self.segments.append(Segment(start, end))
        self.consumed = max(self.consumed, end)

    def calls(self, start: int, end: int, calls: list[Call]) -> None:
        self.segments.append(Segment(start, end, tuple(calls)))
        self.consumed = end

    def reasoning(self, start: int, end: int) -> None:
        if end > start:
            self.segments.append(Segment(start, end, is_reasoning=True))
        self.consumed = max(self.consumed, end)

    def skip(self, end: int) -> None:
        """text up to `end` is markup of the format (neither content nor calls): consumed, never sent."""
        self.consumed = max(self.consumed, end)

    def tail(self, text: str, start: int, final: bool, markers: tuple[str, ...]) -> None:
        """text[start:] holds no call: content, less what may begin a marker (unless `final`);
        whitespace after the last call is dropped."""
        if final:
            after_call = bool(self.segments) and bool(self.segments[-1].calls)
            if after_call and not text[start:].strip():
                self.consumed = len(text)
            else:
                self.content(start, len(text))
        else:
            self.content(start, held_end(text, start, markers))


# Where a bracket scan stopped, so that a stream's next scan of the same (longer) text resumes
# there instead of starting again: (start, quotes) -> (position, depth, open quote, escaped)
BracketMemo = dict[tuple[int, str], tuple[int, int, str, bool]]


def json_end(text: str, start: int, memo: BracketMemo | None = None) -> int | None:
    """Index just past the JSON object or array opening at text[start], or None if the text ends
    first (brackets are only counted, not matched: json.loads judges the span)."""
    return _bracket_end(text, start, '"', memo)


def python_end(text: str, start: int, memo: BracketMemo | None = None) -> int | None:
    """Index just past the bracketed Python expression opening at text[start] (`[` or `(`), or
    None if the text ends first; strings in single or double quotes are skipped."""
    return _bracket_end(text, start, "'\"", memo)


def _bracket_end(text: str, start: int, quotes: str, memo: BracketMemo | None) -> int | None:
    i, depth, quote, escaped = (memo or {}).get((start, quotes), (start, 0, "", False))
    for i in range(i, len(text)):  # noqa: B020  (resumes where the last scan stopped)
        c = text[i]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in quotes:
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth <= 0:
                return i + 1
    if memo is not None:
        memo[(start, quotes)] = (len(text), depth, quote, escaped)
    return None


def held_end(text: str, start: int, markers: tuple[str, ...]) -> int:
    """Where the final content of text[start:] ends: before a suffix that may begin one of
    `markers`, and before the whitespace in front of it (which goes with a call that follows)."""
    end = len(text)
    for n in range(min(len(text) - start, max((len(m) for m in markers), default=0) - 1), 0, -1):
        if any(m.startswith(text[end - n :]) for m in markers):
            end -= n
            break
    while end > start and text[end - 1].isspace():
        end -= 1
    return end


def whitespace_before(text: str, start: int, index: int) -> int:
    """The start of the whitespace run that ends at `index` (not before `start`)."""
    while index > start and text[index - 1].isspace():
        index -= 1
    return index


def call_from_object(value: Any, names: frozenset[str], argument_keys: tuple[str, ...]) -> Call | None:
    """{"name": declared name, "<argument key>": {...}} as a Call; anything else is None.
    Arguments written as a JSON string holding an object are taken too (some models quote them)."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    key = next((k for k in argument_keys if k in value), None)
    arguments = {} if key is None else value[key]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(value["name"], arguments)


def scan_lines(
    text: str,
    final: bool,
    opens: Callable[[str, int], bool | None],
    block: Callable[[str, int, bool], tuple[int, list[Call] | None] | None],
) -> Scan:
    """Scan a format whose calls start a line (JSON objects, Python lists).

    `opens(text, i)`: may a call start at text[i] (None: the text ends too soon to tell)?
    `block(text, i, final)`: (end, calls) of the block there, calls None if it is no call
    (it stays content), or None while the text ends inside it.
    """
    scan = Scan()
    content_start = line = 0
    while True:
        i = line
        while i < len(text) and text[i] in " \t":
            i += 1
        starts = opens(text, i) if i < len(text) else None
        if starts is None and not final:
            scan.content(content_start, whitespace_before(text, content_start, line))
            return scan
        next_from = i
        if starts:
            found = block(text, i, final)
            if found is None and not final:
                scan.content(content_start, whitespace_before(text, content_start, line))
                return scan
            if found is None:
                break
            end, calls = found
            if calls:
                start = whitespace_before(text, content_start, line)
                scan.content(content_start, start)
                scan.calls(start, end, calls)
                content_start = end
            next_from = end
        newline = text.find("\n", next_from)
        if newline < 0:
            break
        line = newline + 1
    scan.tail(text, content_start, final, ())
    return scan
