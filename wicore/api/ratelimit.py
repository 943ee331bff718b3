"""Per-key token bucket: `rate` requests per second on average, bursts of up to `burst`."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from wicore.api.errors import APIError


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._last = clock()

    def is_full(self) -> bool:
        """Whether the bucket has refilled: forgetting it changes nothing."""
        return self._tokens + (self._clock() - self._last) * self.rate >= self.burst

    def take(self) -> float | None:
        """Take one token; None if granted, else the seconds until one is available."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return (1 - self._tokens) / self.rate


def default_burst(requests_per_minute: float) -> int:
    """Ten seconds' worth of requests, at least 5: a client may open a few streams at once (a
    chat page loads models, then asks) without hitting a 429 at a rate it stays under."""
    return max(5, math.ceil(requests_per_minute / 6.0))


class RateLimiter:
    """One bucket per client key (the API key, or the client address when auth is off). Past
    MAX_KEYS keys, refilled buckets are forgotten, so many addresses cannot grow it without bound."""

    MAX_KEYS = 4096

    def __init__(
        self,
        requests_per_minute: float,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        reason: str = "rate limit reached",
        code: str = "rate_limit_exceeded",
    ) -> None:
        """`reason` and `code` say which limit a 429 is (the request rate, or the failed-key lockout)."""
        self.rate = requests_per_minute / 60.0
        self.reason = reason
        self.code = code
        self.burst = float(burst if burst is not None else default_burst(requests_per_minute))
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    @property
    def num_keys(self) -> int:
        return len(self._buckets)

    def check(self, key: str) -> None:
        """Raise a 429 APIError with Retry-After when `key` is over its rate."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.MAX_KEYS:
                    self._buckets = {k: b for k, b in self._buckets.items() if not b.is_full()}
                bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self._clock)
            wait = bucket.take()
        if wait is not None:
            retry = max(1, math.ceil(wait))
            raise APIError(429, f"{self.reason}: retry in {retry} s", code=self.code, headers={"Retry-After": str(retry)})
