"""RateMeter: the engine's tokens_per_second, over a sliding window of wall time."""

from __future__ import annotations

import pytest

from wicore.engine.rate import RateMeter


def test_a_steady_decode_reads_its_own_rate_and_idle_time_brings_it_to_zero(clock):
    meter = RateMeter(window=10.0, clock=clock)
    assert meter.rate() == 0.0  # no time has passed
    for _ in range(40):  # 8 tokens every 0.5 s for 20 s: 16 tok/s
        clock.now += 0.5
        meter.add(8)
    assert meter.rate() == pytest.approx(16.0)
    clock.now += 5.0  # half a window idle: the last 5 s of decoding remain
    assert meter.rate() == pytest.approx(8.0)
    clock.now += 5.0
    assert meter.rate() == 0.0


def test_the_first_seconds_are_divided_by_the_time_since_start_not_the_window(clock):
    meter = RateMeter(window=10.0, clock=clock)
    clock.now += 2.0
    meter.add(30)
    assert meter.rate() == pytest.approx(15.0)


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        RateMeter(window=0)
