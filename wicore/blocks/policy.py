"""Which cached KV blocks to keep: eviction orders over block ids (no bytes, no tiers moved here).

A2CR, attention-aware cache replacement, scores a block by the attention mass it received,
how often and how recently it was used, with a decay over time; LRU is the plain baseline.

The block pool asks a policy for an order over the unreferenced cached blocks of
one tier and evicts from the front. A policy learns about blocks only through
`touch` (a sequence used the block: allocated, reused by a prefix hit, appended,
released), `add_attention` (attention mass the block received, if the graph
reports it) and `forget` (the block id was retired and may be recycled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from wicore.blocks.column import Column


class EvictionPolicy(Protocol):
    """Orders cached blocks for eviction. Times are seconds from the pool's clock."""

    def touch(self, block_id: int, now: float) -> None:
        """A sequence used the block (in a step, at allocation, by a prefix hit, at release)."""

    def add_attention(self, block_id: int, mass: float, now: float | None = None) -> None:
        """The block received `mass` attention (summed over heads/layers/queries); an optional signal.

        Without `now` the mass counts at the latest time the policy has seen.
        """

    def forget(self, block_id: int) -> None:
        """The block id was retired: drop what is known about it (the id may come back as a new block)."""

    def order(self, block_ids: Iterable[int], now: float) -> list[int]:
        """`block_ids` in eviction order: first = evict first; ties keep their order in `block_ids`
        (the block pool passes the deepest blocks of a prefix first). An int64 array is read as
        it is (the block pool passes one of distinct ids); another iterable loses its repeats."""


class LRUPolicy:
    """Least recently used first. A block never touched counts as the oldest."""

    def __init__(self) -> None:
        self._last_access = Column(-math.inf)

    def touch(self, block_id: int, now: float) -> None:
        self._last_access.set(block_id, now)

    def add_attention(self, block_id: int, mass: float, now: float | None = None) -> None:
        """LRU ignores attention."""

    def forget(self, block_id: int) -> None:
        self._last_access.set(block_id, -math.inf)

    def order(self, block_ids: Iterable[int], now: float) -> list[int]:
        ids = _ids(block_ids)
        return ids[np.argsort(self._last_access.take(ids), kind="stable")].tolist()


@dataclass(frozen=True)
class A2CRConfig:
    """Weights of the A2CR score terms and the decay rate of its history, per minute.

    Per minute, not per second: a chat user comes back after minutes. Measured with
    tools/bench_prefix_cache.py (8 users x 4 turns, a user returning every ~15 s on 2 CPU
    cores), 0.05 per second forgot a returning user's uses before their next turn and A2CR
    trailed LRU (80.2% against 80.3% prefix hits); 0.05 per minute (half-life 14 minutes)
    keeps them: 83.4% against 80.3%, and 16% fewer prompt tokens computed.
    """

    w_attention: float = 0.4
    w_frequency: float = 0.3
    w_recency: float = 0.3
    decay: float = 0.05  # per minute

    def __post_init__(self) -> None:
        weights = {"w_attention": self.w_attention, "w_frequency": self.w_frequency, "w_recency": self.w_recency}
        for name, value in weights.items():
            if not value >= 0:  # also rejects NaN
                raise ValueError(f"A2CR weight {name} must be >= 0, got {value}")
        if not sum(weights.values()) > 0:
            raise ValueError("A2CR weights must not all be 0: set at least one of w_attention, w_frequency, w_recency")
        if not self.decay >= 0:
            raise ValueError(f"A2CR decay must be >= 0 (per minute; 0 disables decay), got {self.decay}")


class A2CRPolicy:
    """Attention-aware cache replacement: evict the lowest score first.

    For each candidate block b at time `now`:

        decayed(x) = x * exp(-decay * (now - updated_at[b]))   (frequency and attention
                                                                 decay the same way; times
        F[b] = decayed(access count)       A[b] = decayed(attention mass)     in minutes)
        R[b] = exp(-decay * (now - last_access[b]))            (0 if never touched)

        score[b] = w_attention * A[b] / max(A) + w_frequency * F[b] / max(F) + w_recency * R[b]

    where max runs over the candidate set, and a term whose max is 0 counts 0 for every
    block (so without any attention signal the policy is frequency + recency). Ties keep
    the order the candidates came in.

    The histories are columns indexed by block id (wicore.blocks.column), so `order` scores a
    candidate set with array arithmetic: eviction is asked for on every new block once the
    device is full, over every evictable block. Each operation is the scalar formula's, in its
    order, and the exponentials are `math.exp`'s (numpy's differs in the last bit for a few
    percent of arguments), so the scores and the order are bit for bit those of the formula.
    """

    def __init__(self, config: A2CRConfig | None = None) -> None:
        self.config = config or A2CRConfig()
        self._known = Column(False, np.bool_)  # a history exists (touched or given attention, not forgotten since)
        self._frequency = Column(0.0)  # the counters, valid as of updated_at
        self._attention = Column(0.0)
        self._updated_at = Column(0.0)
        self._last_access = Column(-math.inf)
        self._latest = 0.0  # the latest time seen, for attention reported without a time

    def touch(self, block_id: int, now: float) -> None:
        self._decay_to(block_id, now)
        self._frequency.set(block_id, self._frequency.get(block_id) + 1.0)
        self._last_access.set(block_id, max(self._last_access.get(block_id), now))

    def add_attention(self, block_id: int, mass: float, now: float | None = None) -> None:
        if mass < 0:
            raise ValueError(f"attention mass must be >= 0, got {mass}")
        self._decay_to(block_id, self._latest if now is None else now)
        self._attention.set(block_id, self._attention.get(block_id) + mass)

    def forget(self, block_id: int) -> None:
        self._known.set(block_id, False)

    def order(self, block_ids: Iterable[int], now: float) -> list[int]:
        ids = _ids(block_ids)
        return ids[np.argsort(self._scores(ids, now), kind="stable")].tolist()

    def scores(self, block_ids: Iterable[int], now: float) -> dict[int, float]:
        """Each block's score at `now` (see the class docstring); no block's history changes."""
        ids = _ids(block_ids)
        return dict(zip(ids.tolist(), self._scores(ids, now).tolist(), strict=True))

    # -- helpers -------------------------------------------------------------------------
    def _scores(self, ids: np.ndarray, now: float) -> np.ndarray:
        """The scores of `ids` (distinct) at `now`, in their order."""
        self._latest = max(self._latest, now)
        cfg = self.config
        known = self._known.take(ids)
        touched = known & (self._last_access.take(ids) != -math.inf)
        # exp(-decay * dt) of the counters (known blocks) and of the last access (touched ones), in one pass
        exponents = np.concatenate(
            [self._exponents(self._updated_at.take(ids[known]), now), self._exponents(self._last_access.take(ids[touched]), now)]
        )
        exps = np.fromiter(map(math.exp, exponents.tolist()), np.float64, len(exponents))
        num_known = int(known.sum())
        factor = np.zeros(len(ids))
        factor[known] = exps[:num_known]
        recency = np.zeros(len(ids))
        recency[touched] = exps[num_known:]
        frequency = np.where(known, self._frequency.take(ids) * factor, 0.0)
        attention = np.where(known, self._attention.take(ids) * factor, 0.0)
        return cfg.w_attention * _ratio(attention) + cfg.w_frequency * _ratio(frequency) + cfg.w_recency * recency

    def _exponents(self, since: np.ndarray, now: float) -> np.ndarray:
        """-decay * dt, dt in minutes (the clock counts seconds); a clock that steps back
        (dt < 0) decays nothing."""
        return -self.config.decay * np.maximum(0.0, now - since) / 60.0

    def _factor(self, since: float, now: float) -> float:
        """exp(-decay * dt) of one block (as `_exponents`)."""
        return math.exp(-self.config.decay * max(0.0, now - since) / 60.0)

    def _decay_to(self, block_id: int, now: float) -> None:
        """Bring the block's counters forward to `now` (a fresh history if it has none)."""
        self._latest = max(self._latest, now)
        if not self._known.get(block_id):
            self._known.set(block_id, True)
            self._frequency.set(block_id, 0.0)
            self._attention.set(block_id, 0.0)
            self._updated_at.set(block_id, now)
            self._last_access.set(block_id, -math.inf)
            return
        updated_at = self._updated_at.get(block_id)
        if now > updated_at:
            factor = self._factor(updated_at, now)
            self._frequency.set(block_id, self._frequency.get(block_id) * factor)
            self._attention.set(block_id, self._attention.get(block_id) * factor)
            self._updated_at.set(block_id, now)


def _ids(block_ids: Iterable[int]) -> np.ndarray:
    """The candidates as an int64 array: an array is taken as it is (distinct ids), anything else
    loses its repeats (first place kept)."""
    if isinstance(block_ids, np.ndarray):
        return block_ids.astype(np.int64, copy=False)
    return np.fromiter(dict.fromkeys(block_ids), np.int64)


def _ratio(values: np.ndarray) -> np.ndarray:
    """values / max(values), or 0 everywhere when the max is 0 (no signal in this term)."""
    maximum = values.max(initial=0.0)
    return values / maximum if maximum > 0 else np.zeros(len(values))
