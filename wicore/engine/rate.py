"""Tokens a second over a sliding window of wall time: the engine's `tokens_per_second`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RateMeter:
    """Counts added over the last `window` seconds, divided by the window (or by the time since
    the meter started, when that is shorter). Idle time counts: with nothing added for a window,
    the rate is 0."""

    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if window <= 0:
            raise ValueError("window must be > 0")
        self.window = window
        self._clock = clock
        self._started = clock()
        self._events: deque[tuple[float, int]] = deque()

    def add(self, count: int) -> None:
        now = self._clock()
        self._events.append((now, count))
        self._forget(now)

    def rate(self) -> float:
        now = self._clock()
        self._forget(now)
        span = min(self.window, now - self._started)
        return sum(n for _, n in self._events) / span if span > 0 else 0.0

    def _forget(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window:
            self._events.popleft()
