"""The streaming path (issue 32): a text chunk's event written from a template gives what encoding the
whole chunk gives; a shutdown's cut ends an answer at once; leaving early closes its choice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from wicore.api.errors import APIError
from wicore.api.generation import Piece
from wicore.api.streaming import Streams, TextChunk, chunks, event_stream, merge, sse

TEXTS = ["Hello", ' "quoted" \\ back', "tab\there\nnew", "\x00\x1f ctl", "\u2028\u2029\x85 seps", "é 日本 \U0001f600", "\ue000wicore-text\ue000"]  # fmt: skip


async def pieces(items: list[Piece], reached: list[str] | None = None) -> AsyncIterator[Piece]:
    try:
        for item in items:
            yield item
            await asyncio.sleep(0)
    finally:
        if reached is not None:
            reached.append("closed")


def events(is_chat: bool, include_usage: bool, n: int, model: str = "m") -> tuple[list[str], list[dict]]:
    """The SSE events of a stream of TEXTS then a finish (one choice or `n`), and its chunk objects."""
    base = {"id": "cmpl-1", "created": 7, "model": model}

    def choices() -> list[AsyncIterator[Piece]]:
        return [pieces([*(Piece(t) for t in TEXTS), Piece("", "length")]) for _ in range(n)]

    async def run() -> tuple[list[str], list[dict]]:
        usage = lambda: {"completion_tokens": 3}
        sent = [e async for e in event_stream(chunks(base, is_chat, choices(), usage, include_usage), "s")]  # fmt: skip
        objects = [c async for c in chunks(base, is_chat, choices(), usage, include_usage)]
        assert sum(type(c) is TextChunk for c in objects) == len(TEXTS) * n  # every text piece took the template
        return sent, [dict(c) for c in objects]

    return asyncio.run(run())


@pytest.mark.parametrize("is_chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("n", [1, 2])
def test_text_chunks_events_are_the_objects_encoded(is_chat, include_usage, n):
    sent, objects = events(is_chat, include_usage, n)
    assert sent == [sse(o) for o in objects] + ["data: [DONE]\n\n"]
    texts = [json.loads(e[6:])["choices"] for e in sent[:-1]]
    field = "delta" if is_chat else "text"
    got = ["".join((c[0][field].get("content", "") if is_chat else c[0][field]) for c in texts if c and c[0]["index"] == i) for i in range(n)]  # fmt: skip
    assert got == ["".join(TEXTS)] * n


def test_a_model_named_like_the_template_mark_keeps_its_events_exact():
    sent, objects = events(False, True, 1, model="\ue000wicore-text\ue000")
    assert sent == [sse(o) for o in objects] + ["data: [DONE]\n\n"]


def test_a_cut_ends_a_choice_whose_engine_sends_nothing_more():
    """A shutdown's cut raises the 503 at once, even where the choice's next piece never comes (a
    long step, a stuck engine): the answer does not wait for the engine."""
    streams = Streams()

    async def stuck() -> AsyncIterator[Piece]:
        yield Piece("a")
        await asyncio.Event().wait()  # no further output, ever
        yield Piece("never")

    async def run() -> tuple[list[str], APIError]:
        got: list[str] = []
        with pytest.raises(APIError) as raised:
            async for index, piece in merge([stuck()], streams):
                assert index == 0
                got.append(piece.text)
                streams.cut()
        assert not streams.open
        return got, raised.value

    got, error = asyncio.run(asyncio.wait_for(run(), 5.0))
    assert got == ["a"] and (error.status, error.code) == (503, "server_shutting_down")


def test_one_choice_left_early_is_closed():
    reached: list[str] = []
    streams = Streams()

    async def run() -> list[str]:
        merged = merge([pieces([Piece("a"), Piece("b")], reached)], streams)
        got = [(await merged.__anext__())[1].text]
        await merged.aclose()  # type: ignore[attr-defined]
        assert not streams.open
        return got

    assert asyncio.run(run()) == ["a"] and reached == ["closed"]
