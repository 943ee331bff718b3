"""The scheduler alone, over a real KVCache: progress when DEVICE is tight.

No model runs here: each scheduled row that needs logits is given token 7, which is all the
scheduler needs to account for a step. What is under test is which requests run, and that
every one of them ends.
"""

from __future__ import annotations

import itertools

import pytest

from wicore.hmt.block_pool import BlockPool
from wicore.hmt.kv_cache import KVCache
from wicore.hmt.policy import LRUPolicy
from wicore.hmt.tiers import Tier
from wicore.runtime.request import Priority, Request, RequestOutput
from wicore.runtime.sampler import Sample, SamplingParams
from wicore.runtime.scheduler import Scheduler, SchedulerConfig

BS = 4
PREFIX = list(range(100, 108))  # two full blocks, shared by the first two requests


class Driver:
    def __init__(self, num_device_blocks: int, num_host_blocks: int = 64, **config: int) -> None:
        self.pool = KVCache(BlockPool(num_device_blocks, num_host_blocks, 0, BS, LRUPolicy()))
        self.now = 0.0
        config = {"max_num_batched_tokens": 64, "prefill_chunk": 64, **config}
        self.sched = Scheduler(SchedulerConfig(**config), self.pool, clock=lambda: self.now)
        self.ended: dict[str, RequestOutput] = {}
        self.generated: dict[str, int] = {}

    def add(self, request_id: str, prompt: list[int], max_tokens: int, priority: Priority) -> None:
        self.now += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.sched.add(Request(request_id, prompt, params, priority, self.now))
        self.generated[request_id] = 0

    def step(self) -> list[tuple[str, int]]:
        """Run one step; (request id, tokens run) of its rows."""
        out = self.sched.schedule()
        results = self.sched.update(out.rows, {r.request_id: Sample(7) for r in out.rows if r.needs_logits})
        for result in [*out.finished, *results]:
            self.generated[result.request_id] += len(result.new_token_ids)
            if result.finished:
                self.ended[result.request_id] = result
        return [(r.request_id, len(r.token_ids)) for r in out.rows]

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError(f"no end after {max_steps} steps: running {self.sched.running}, swapped {self.sched.swapped}")


def referenced(pool: KVCache) -> int:
    """Blocks some sequence still holds, in any tier (cached blocks nobody holds are not counted)."""
    return sum(g.pool.usage(t) - g.pool.num_evictable(t) for g in pool.groups for t in Tier)


def blocks_for(prompt: int, new: int) -> int:
    return -(-(prompt + new - 1) // BS)  # the last token is sampled, never run


def pinned_prefix(device: int, a_new: int, s_extra: int, s_new: int, r_prompt: int, r_new: int) -> Driver:
    """A (high) and S (low) share PREFIX; R (urgent) arrives last and grows. R's growth swaps S
    out, then A: the prefix blocks they share stay on DEVICE, held by two swapped requests."""
    d = Driver(device)
    d.add("A", PREFIX, a_new, Priority.HIGH)
    d.step()
    d.add("S", PREFIX + list(range(s_extra)), s_new, Priority.LOW)
    d.step()
    d.add("R", list(range(200, 200 + r_prompt)), r_new, Priority.URGENT)
    return d


def test_swapped_requests_pinning_a_shared_prefix_do_not_stall_the_one_that_runs():
    """Before the fix R went out and in again on every step (found by the grid below): DEVICE
    minus the two pinned prefix blocks was one block short of R, and nothing else could run."""
    d = pinned_prefix(device=10, a_new=10, s_extra=4, s_new=10, r_prompt=12, r_new=18)
    for _ in range(12):  # R, A and S run; R's growth swaps S, then A, out
        d.step()
    assert [r.request_id for r in d.sched.swapped] == ["S", "A"]
    assert all(d.pool.num_blocks_in(d.sched.requests[r].seq_id, Tier.DEVICE) for r in "SA")
    d.run()
    assert {r: e.finish_reason for r, e in d.ended.items()} == {"A": "length", "S": "length", "R": "length"}
    assert d.generated == {"A": 10, "S": 10, "R": 18}
    assert d.sched.stats.num_preempted_recompute >= 1  # a pinning request was sent back to recompute
    assert referenced(d.pool) == 0


GRID = [
    case
    for case in itertools.product([10, 12, 14, 18], [10, 20, 30], [4, 8, 16, 24], [4, 10, 20], [8, 12], range(10, 50, 8))
    if max(blocks_for(*case[4:]), blocks_for(8 + case[2], case[3]), blocks_for(8, case[1])) <= case[0] - 1
]


def test_every_request_that_fits_the_device_tier_alone_ends():
    """All sizes where each request alone fits DEVICE (as Engine.add_request requires): every
    request ends with all its tokens, and the pool returns to empty."""
    assert len(GRID) > 300
    for case in GRID:
        d = pinned_prefix(*case)
        d.run()
        assert d.generated == {"A": case[1], "S": case[3], "R": case[5]}, case
        assert {e.finish_reason for e in d.ended.values()} == {"length"}, case
        assert referenced(d.pool) == 0, case


@pytest.mark.parametrize("others", [False, True])
def test_a_request_the_device_tier_cannot_hold_fails_with_a_reason_instead_of_looping(others):
    """The engine refuses such requests at add_request; the scheduler must not spin on one either."""
    d = Driver(num_device_blocks=6)  # 5 usable blocks (one is the sink)
    if others:
        d.add("small", [1, 2, 3], 3, Priority.LOW)
    d.add("big", list(range(200, 212)), 20, Priority.NORMAL)  # 31 tokens of KV: 8 blocks
    d.run()
    big = d.ended["big"]
    assert big.finish_reason == "error" and "needs more KV blocks than the device tier holds" in big.error
    if others:
        assert d.ended["small"].finish_reason == "length" and d.generated["small"] == 3
    assert referenced(d.pool) == 0


def test_an_idle_engine_prefills_a_burst_at_full_budget_and_a_decoding_one_a_little_at_a_time():
    d = Driver(200, max_num_batched_tokens=64, prefill_with_decodes=16, prefill_chunk=32)
    for i in range(4):
        d.add(f"r{i}", list(range(30 * i, 30 * i + 30)), 8, Priority.NORMAL)
    assert d.step() == [("r0", 30), ("r1", 30), ("r2", 4)]  # nothing decodes: 64 tokens of prefill
    # r0 and r1 decode now: prefill chunks get 16 tokens a step, the decodes their one each
    assert d.step() == [("r0", 1), ("r1", 1), ("r2", 16)]
    assert d.step() == [("r0", 1), ("r1", 1), ("r2", 10), ("r3", 6)]
    assert d.step() == [("r0", 1), ("r1", 1), ("r2", 1), ("r3", 16)]
    d.run()
    assert d.generated == {f"r{i}": 8 for i in range(4)}
