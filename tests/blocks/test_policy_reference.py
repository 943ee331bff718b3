"""The block pool's eviction choices with the array-scored policies equal those of the scalar
formulas (the policies as they were before their histories became columns), move for move, on a
long scripted run with prefix hits, sliding-window releases, swaps, attention and ties in time;
and the block tables a pool keeps per sequence stay the frames its blocks lie in."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable

import pytest

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import BlockPool, Move
from wicore.blocks.policy import A2CRConfig, A2CRPolicy, EvictionPolicy, LRUPolicy


class ScalarLRU:
    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def touch(self, block_id: int, now: float) -> None:
        self.last[block_id] = now

    def add_attention(self, block_id: int, mass: float, now: float | None = None) -> None:
        pass

    def forget(self, block_id: int) -> None:
        self.last.pop(block_id, None)

    def order(self, block_ids: Iterable[int], now: float) -> list[int]:
        return sorted((int(b) for b in block_ids), key=lambda b: self.last.get(b, -math.inf))


class ScalarA2CR:
    """A2CRPolicy's class docstring, one block at a time."""

    def __init__(self) -> None:
        self.cfg = A2CRConfig()
        self.history: dict[int, list[float]] = {}  # [frequency, attention, updated_at, last_access]
        self.latest = 0.0

    def factor(self, since: float, now: float) -> float:
        return math.exp(-self.cfg.decay * max(0.0, now - since) / 60.0)

    def decayed_to(self, block_id: int, now: float) -> list[float]:
        self.latest = max(self.latest, now)
        h = self.history.setdefault(block_id, [0.0, 0.0, now, -math.inf])
        if now > h[2]:
            f = self.factor(h[2], now)
            h[0], h[1], h[2] = h[0] * f, h[1] * f, now
        return h

    def touch(self, block_id: int, now: float) -> None:
        h = self.decayed_to(block_id, now)
        h[0] += 1.0
        h[3] = max(h[3], now)

    def add_attention(self, block_id: int, mass: float, now: float | None = None) -> None:
        self.decayed_to(block_id, self.latest if now is None else now)[1] += mass

    def forget(self, block_id: int) -> None:
        self.history.pop(block_id, None)

    def order(self, block_ids: Iterable[int], now: float) -> list[int]:
        self.latest = max(self.latest, now)
        terms = {}
        for b in (int(b) for b in block_ids):
            h = self.history.get(b)
            if h is None:
                terms[b] = (0.0, 0.0, 0.0)
                continue
            f = self.factor(h[2], now)
            terms[b] = (h[0] * f, h[1] * f, 0.0 if h[3] == -math.inf else self.factor(h[3], now))
        max_f = max((t[0] for t in terms.values()), default=0.0)
        max_a = max((t[1] for t in terms.values()), default=0.0)
        c = self.cfg
        scores = {
            b: c.w_attention * (a / max_a if max_a > 0 else 0.0)
            + c.w_frequency * (f / max_f if max_f > 0 else 0.0)
            + c.w_recency * r
            for b, (f, a, r) in terms.items()
        }
        return sorted(scores, key=scores.__getitem__)


def scripted_run(make_policy: Callable[[], EvictionPolicy], seed: int, num_ops: int = 1200) -> list[object]:
    """Every plan and the blocks after each operation of a seeded random run over two block groups."""
    rng = random.Random(seed)
    now = [0.0]
    full = BlockPool(40, 12, 8, 4, make_policy(), clock=lambda: now[0])
    window = BlockPool(24, 8, 0, 4, make_policy(), clock=lambda: now[0], group=1)
    kv = BlockGroups(full, window, 8)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 20))] for _ in range(6)]
    seqs: dict[int, tuple[list[int], int]] = {}
    log: list[object] = []
    for op in range(num_ops):
        now[0] += rng.choice([0.0, 0.0, 0.5, 1.0, 7.0, 90.0])  # blocks tie in time, and decay
        draw = rng.random()
        if draw < 0.3 and len(seqs) < 8:
            tokens = list(rng.choice(prefixes)) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
            alloc = kv.allocate(op, tokens, 8)
            log.append(alloc)
            if alloc is not None:
                seqs[op] = (tokens, alloc.num_cached_tokens)
        elif draw < 0.8 and seqs:
            seq_id = rng.choice(sorted(seqs))
            tokens, done = seqs.pop(seq_id)
            n = min(len(tokens) - done, 8) or 1
            plan: list[Move] | None = kv.append(seq_id, done, done + n)
            log.append(plan)
            if plan is None:
                kv.free(seq_id)
                continue
            done += n
            if done >= len(tokens):
                tokens.append(rng.randrange(50))
            kv.commit(seq_id, tokens, done)
            if rng.random() < 0.1:
                full.add_attention(rng.choice(full.block_ids(seq_id)), rng.random(), now[0])
            seqs[seq_id] = (tokens, done)
        elif seqs:
            seq_id = rng.choice(sorted(seqs))
            if rng.random() < 0.3 and (plan := kv.swap_out(seq_id)) is not None:
                log += [plan, kv.swap_in(seq_id)]
                if log[-1] is not None:
                    continue
            kv.free(seq_id)
            del seqs[seq_id]
        log.append([g.pool.blocks() for g in kv.groups])
        for g in kv.groups:  # the kept block tables are the frames the blocks lie in now
            frame_of = {b.block_id: b.frame for b in g.pool.blocks()}
            assert all(g.pool.block_table(s) == [frame_of[b] for b in g.pool.block_ids(s)] for s in seqs)
    return log


@pytest.mark.parametrize(("policy", "reference"), [(A2CRPolicy, ScalarA2CR), (LRUPolicy, ScalarLRU)])
@pytest.mark.parametrize("seed", [0, 1])
def test_evictions_equal_the_scalar_formulas(
    policy: Callable[[], EvictionPolicy], reference: Callable[[], EvictionPolicy], seed: int
) -> None:
    log = scripted_run(policy, seed)
    drops = [m for plan in log if isinstance(plan, list) for m in plan if isinstance(m, Move) and m.dst is None]
    assert len(drops) > 100  # the run evicts (a run that never fills the tiers would prove nothing)
    assert log == scripted_run(reference, seed)
