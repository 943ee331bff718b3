"""Per-request output channel from the engine thread to a sync or asyncio consumer.

A step's outputs go out together (`put_all`): every channel gets its output first, then each event
loop with consumers waiting is woken once, not once a channel. At 256 streams that is one
`call_soon_threadsafe` (a write to the loop's self-pipe, and a GIL hand-over the engine thread then
waits for) a step instead of 256.

An asyncio consumer that fell behind reads everything ready as one output (`merge_outputs`), as
vLLM's `RequestOutputCollector` does: at 256 streams the event loop can lag a step or more, and a
stream that is k steps behind then costs one wakeup, one detokenization and one SSE event, not k.
The lag is what shrinks: tokens a step that the loop cannot keep up with one at a time come out in
fewer, larger pieces, so the server's cost a token falls just when the loop is the bottleneck.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator

from wicore.types.outputs import RequestOutput, merge_outputs


class Channel:
    """Outputs of one request, in order, ending with a `finished` output.

    The engine thread `put`s; one consumer reads, either blocking (`__iter__`: one output a
    step) or from an event loop (`__aiter__`: everything put since its last read, merged).
    Outputs put before the consumer attaches are kept.
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
            if not self._items:  # read without the lock (a deque's length is one atomic read): a
                await self._event.wait()  # consumer that waits for every step takes the lock once a step
                self._event.clear()
                continue
            item = merge_outputs(self.take_ready())  # the steps this consumer fell behind by, as one output
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
