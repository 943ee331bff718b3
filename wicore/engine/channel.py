"""Per-request output channel from the engine thread to a sync or asyncio consumer.

A step's outputs go out together (`put_all`): every channel gets its output first, then each event
loop with consumers waiting is woken once, not once a channel. At 256 streams that is one
`call_soon_threadsafe` (a write to the loop's self-pipe, and a GIL hand-over the engine thread then
waits for) a step instead of 256.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator

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
        put_all([(self, output)])

    def _append(self, output: RequestOutput) -> tuple[asyncio.AbstractEventLoop, asyncio.Event] | None:
        """Keep `output`, wake a blocking consumer; the asyncio consumer's loop and event to set, if any."""
        with self._cond:
            self.is_finished = self.is_finished or output.finished
            self._items.append(output)
            self._cond.notify_all()
            loop, event = self._loop, self._event
        return None if loop is None or event is None else (loop, event)

    def _pop(self) -> RequestOutput | None:
        with self._cond:
            return self._items.popleft() if self._items else None

    def take_ready(self) -> list[RequestOutput]:
        """The outputs already put and not yet read, without waiting (for a consumer that batches)."""
        with self._cond:
            items = list(self._items)
            self._items.clear()
        return items

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


def put_all(outputs: Iterable[tuple[Channel, RequestOutput]]) -> None:
    """Put each output in its channel, in order, then wake each event loop that has consumers once."""
    wake: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for channel, output in outputs:
        waiter = channel._append(output)
        if waiter is not None:
            wake.setdefault(waiter[0], []).append(waiter[1])
    for loop, events in wake.items():
        try:
            loop.call_soon_threadsafe(_set_all, events)
        except RuntimeError:  # the consumers' loop is closed: nobody is listening
            pass


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()
