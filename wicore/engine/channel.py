"""Per-request output channel from the engine thread to a sync or asyncio consumer."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator

from wicore.types.outputs import RequestOutput


class Channel:
    """Outputs of one request, in order, ending with a `finished` output.

    The engine thread `put`s; one consumer reads, either blocking (`__iter__`) or
    from an event loop (`__aiter__`). Outputs put before the consumer attaches are kept.
    """

    def __init__(self) -> None:
        self._items: deque[RequestOutput] = deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.claimed = False  # a consumer has taken this channel
        self.is_finished = False  # the final output has been put

    def put(self, output: RequestOutput) -> None:
        with self._cond:
            self.is_finished = self.is_finished or output.finished
            self._items.append(output)
            self._cond.notify_all()
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    def _pop(self) -> RequestOutput | None:
        with self._cond:
            return self._items.popleft() if self._items else None

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items)
                item = self._items.popleft()
            yield item
            if item.finished:
                return

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        with self._cond:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        while True:
            item = self._pop()
            if item is None:
                await self._event.wait()
                self._event.clear()
                continue
            yield item
            if item.finished:
                return
