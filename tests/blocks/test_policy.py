"""Eviction orders: exact results of LRU and A2CR on hand-made access histories."""

from __future__ import annotations

import math
from typing import TypeVar

import pytest

from wicore.blocks.policy import A2CRConfig, A2CRPolicy, LRUPolicy

P = TypeVar("P", LRUPolicy, A2CRPolicy)


def touched(policy: P, history: dict[int, list[float]]) -> P:
    """Apply `history` (block id -> access times) to `policy` in time order."""
    events = sorted((t, block_id) for block_id, times in history.items() for t in times)
    for t, block_id in events:
        policy.touch(block_id, t)
    return policy


# A block used five times long ago and a block used once, more recently.
OLD_AND_FREQUENT = {1: [0.0, 1.0, 2.0, 3.0, 4.0], 2: [5.0]}


# -- LRU -----------------------------------------------------------------------------------
def test_lru_evicts_the_least_recently_used_first():
    policy = touched(LRUPolicy(), {1: [3.0], 2: [1.0], 3: [2.0]})
    assert policy.order([1, 2, 3], now=4.0) == [2, 3, 1]


def test_lru_keeps_the_given_order_on_ties_and_puts_unknown_blocks_first():
    policy = touched(LRUPolicy(), {4: [1.0], 2: [1.0], 7: [0.5]})
    assert policy.order([4, 9, 2, 7], now=2.0) == [9, 7, 4, 2]
    assert policy.order([2, 9, 4, 7], now=2.0) == [9, 7, 2, 4]


def test_lru_ignores_frequency_and_attention():
    policy = touched(LRUPolicy(), OLD_AND_FREQUENT)
    policy.add_attention(1, 100.0)
    assert policy.order([1, 2], now=6.0) == [1, 2]


def test_lru_forget_drops_the_history():
    policy = touched(LRUPolicy(), {1: [1.0], 2: [2.0]})
    policy.forget(2)
    assert policy.order([1, 2], now=3.0) == [2, 1]


# -- A2CR ----------------------------------------------------------------------------------
def test_a2cr_keeps_a_frequently_used_old_block_that_lru_evicts():
    assert touched(LRUPolicy(), OLD_AND_FREQUENT).order([1, 2], now=6.0) == [1, 2]
    assert touched(A2CRPolicy(), OLD_AND_FREQUENT).order([1, 2], now=6.0) == [2, 1]


def test_a2cr_score_follows_the_formula():
    policy = touched(A2CRPolicy(), {1: [0.0, 10.0], 2: [5.0]})
    policy.add_attention(2, 2.0, now=5.0)
    frequency_1 = (math.exp(-0.05 * 10 / 60) + 1) * math.exp(-0.05 * 10 / 60)
    frequency_2 = math.exp(-0.05 * 15 / 60)
    scores = policy.scores([1, 2], now=20.0)
    # Block 1 has the max frequency and no attention; block 2 the max attention.
    assert scores[1] == pytest.approx(0.3 * 1.0 + 0.3 * math.exp(-0.05 * 10 / 60))
    assert scores[2] == pytest.approx(0.4 * 1.0 + 0.3 * frequency_2 / frequency_1 + 0.3 * math.exp(-0.05 * 15 / 60))
    assert policy.order([1, 2], now=20.0) == [1, 2]


def test_a2cr_without_attention_is_frequency_plus_recency():
    policy = touched(A2CRPolicy(), {1: [2.0]})
    assert policy.scores([1], now=2.0) == {1: pytest.approx(0.3 + 0.3)}


def test_a2cr_attention_mass_changes_the_order():
    policy = touched(A2CRPolicy(), {1: [0.0], 2: [0.0]})
    assert policy.order([1, 2], now=1.0) == [1, 2]  # same history: ties keep the given order
    assert policy.order([2, 1], now=1.0) == [2, 1]
    policy.add_attention(1, 5.0)
    assert policy.order([1, 2], now=1.0) == [2, 1]
    policy.add_attention(2, 6.0)
    assert policy.order([1, 2], now=1.0) == [1, 2]


def test_a2cr_attention_outweighs_a_little_frequency():
    policy = touched(A2CRPolicy(), {1: [0.0, 0.0], 2: [0.0]})
    assert policy.order([1, 2], now=1.0) == [2, 1]
    policy.add_attention(2, 1.0)
    assert policy.order([1, 2], now=1.0) == [1, 2]


def test_a2cr_decay_makes_old_frequency_fade():
    """Decay is per minute: five uses at minutes 0-4 fade below two at minutes 100-101."""
    history = {1: [0.0, 60.0, 120.0, 180.0, 240.0], 2: [6000.0, 6060.0]}
    assert touched(A2CRPolicy(), history).order([1, 2], now=6120.0) == [1, 2]
    assert touched(A2CRPolicy(A2CRConfig(decay=0.0)), history).order([1, 2], now=6120.0) == [2, 1]
    # within seconds nothing fades: the five uses still rank above the two recent ones
    seconds = {1: [0.0, 1.0, 2.0, 3.0, 4.0], 2: [100.0, 101.0]}
    assert touched(A2CRPolicy(), seconds).order([1, 2], now=102.0) == [2, 1]


def test_a2cr_attention_without_a_time_counts_at_the_latest_time_seen():
    implicit = touched(A2CRPolicy(), {1: [10.0], 2: [10.0]})
    implicit.add_attention(1, 3.0)
    explicit = touched(A2CRPolicy(), {1: [10.0], 2: [10.0]})
    explicit.add_attention(1, 3.0, now=10.0)
    assert implicit.scores([1, 2], now=30.0) == pytest.approx(explicit.scores([1, 2], now=30.0))


def test_a2cr_unknown_and_forgotten_blocks_score_zero_and_go_first():
    policy = touched(A2CRPolicy(), {1: [0.0], 2: [0.0], 3: [0.0]})
    policy.forget(3)
    assert policy.scores([3, 4], now=1.0) == {3: 0.0, 4: 0.0}
    assert policy.order([1, 2, 3, 4], now=1.0) == [3, 4, 1, 2]


def test_a2cr_rejects_negative_attention():
    with pytest.raises(ValueError, match="attention mass"):
        A2CRPolicy().add_attention(1, -1.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"w_attention": -0.1}, "w_attention"),
        ({"w_frequency": float("nan")}, "w_frequency"),
        ({"w_attention": 0.0, "w_frequency": 0.0, "w_recency": 0.0}, "not all be 0"),
        ({"decay": -1.0}, "decay"),
    ],
)
def test_a2cr_config_is_validated(fields: dict[str, float], message: str):
    with pytest.raises(ValueError, match=message):
        A2CRConfig(**fields)


def test_a2cr_config_defaults():
    assert A2CRConfig() == A2CRConfig(w_attention=0.4, w_frequency=0.3, w_recency=0.3, decay=0.05)
