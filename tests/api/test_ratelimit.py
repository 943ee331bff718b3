from __future__ import annotations

import pytest

from wicore.api.errors import APIError
from wicore.api.ratelimit import RateLimiter, default_burst


def test_bucket_allows_a_burst_then_429_with_retry_after(clock):
    limiter = RateLimiter(requests_per_minute=60, burst=2, clock=clock)
    limiter.check("a")
    limiter.check("a")
    with pytest.raises(APIError) as info:
        limiter.check("a")
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
    limiter.check("b")  # keys have their own buckets
    clock.now = 1.0  # one request per second refills
    limiter.check("a")
    with pytest.raises(APIError):
        limiter.check("a")


def test_retry_after_rounds_up_to_the_refill_time(clock):
    limiter = RateLimiter(requests_per_minute=6, burst=1, clock=clock)
    limiter.check("a")
    clock.now = 2.5
    with pytest.raises(APIError) as info:
        limiter.check("a")
    assert info.value.headers["Retry-After"] == "8"  # 10 s per token, 2.5 s already refilled


def test_refilled_buckets_are_forgotten_past_max_keys_and_limited_ones_kept(clock):
    limiter = RateLimiter(requests_per_minute=60, burst=1, clock=clock)
    limiter.MAX_KEYS = 5
    for i in range(3):
        limiter.check(f"old-{i}")  # t=0: one token each, spent; full again at t=1
    clock.now = 0.5
    limiter.check("new-0")  # full again at t=1.5
    clock.now = 1.4
    limiter.check("hot")  # spent at t=1.4: not full at t=1.5
    assert limiter.num_keys == 5
    clock.now = 1.5
    limiter.check("new-1")  # past MAX_KEYS: the four refilled buckets go, "hot" stays
    assert limiter.num_keys == 2
    with pytest.raises(APIError):
        limiter.check("hot")


def test_the_default_burst_is_ten_seconds_worth_and_at_least_five(clock):
    assert [default_burst(rpm) for rpm in (6, 30, 60, 120, 600)] == [5, 5, 10, 20, 100]
    limiter = RateLimiter(requests_per_minute=120, clock=clock)  # --rate-limit 120: 20 at once, then 429
    for _ in range(20):
        limiter.check("a")
    with pytest.raises(APIError):
        limiter.check("a")
