"""The scheduler alone, over real BlockGroups: progress when DEVICE is tight, and the order of admission.

No model runs here: each scheduled row that needs a sample is given token 7, which is all the
scheduler needs to account for a step. What is under test is which requests run, and that
every one of them ends.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import LRUPolicy
from wicore.blocks.tier import Tier
from wicore.engine.request import Request
from wicore.engine.scheduler import Scheduler, SchedulerConfig
from wicore.types.images import ImageInput, ImageSpan
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import Sample, SamplingParams
from wicore.types.step import RunResult

BS = 4
PREFIX = list(range(100, 108))  # two full blocks, shared by the first two requests


class Driver:
    def __init__(self, num_device_blocks: int, num_host_blocks: int = 64, **config: float) -> None:
        self.kv = BlockGroups(BlockPool(num_device_blocks, num_host_blocks, 0, BS, LRUPolicy()))
        self.now = 0.0
        config = {"max_num_batched_tokens": 64, "prefill_chunk": 64, **config}
        self.sched = Scheduler(SchedulerConfig(**config), self.kv, clock=lambda: self.now)
        self.ended: dict[str, RequestOutput] = {}
        self.generated: dict[str, int] = {}

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, priority: Priority, image_spans: tuple[ImageSpan, ...] = ()
    ) -> None:
        self.now += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.sched.add(Request(request_id, prompt, params, max_tokens, priority, self.now, image_spans=image_spans))
        self.generated[request_id] = 0

    def step(self) -> list[tuple[str, int]]:
        """Run one step; (request id, tokens run) of its rows."""
        out = self.sched.schedule()
        results = self.sched.update(out.rows, RunResult(sampled={r.request_id: Sample(7) for r in out.rows if r.needs_sample}))
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


def referenced(kv: BlockGroups) -> int:
    """Blocks some sequence still holds, in any tier (cached blocks nobody holds are not counted)."""
    return sum(g.pool.usage(t) - g.pool.num_evictable(t) for g in kv.groups for t in Tier)


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
    assert all(d.kv.num_blocks_in(d.sched.requests[r].seq_id, Tier.DEVICE) for r in "SA")
    d.run()
    assert {r: e.finish_reason for r, e in d.ended.items()} == {"A": "length", "S": "length", "R": "length"}
    assert d.generated == {"A": 10, "S": 10, "R": 18}
    assert d.sched.stats.num_preempted_recompute >= 1  # a pinning request was sent back to recompute
    assert referenced(d.kv) == 0


GRID = [
    case
    for case in itertools.product([10, 12, 14, 18], [10, 20, 30], [4, 8, 16, 24], [4, 10, 20], [8, 12], range(10, 50, 8))
    if max(blocks_for(*case[4:]), blocks_for(8 + case[2], case[3]), blocks_for(8, case[1])) <= case[0] - 1
]


@pytest.mark.slow  # 5 s on the 2-core VM, loaded
def test_every_request_that_fits_the_device_tier_alone_ends():
    """All sizes where each request alone fits DEVICE (as Engine.add_request requires): every
    request ends with all its tokens, and the pool returns to empty."""
    assert len(GRID) > 300
    for case in GRID:
        d = pinned_prefix(*case)
        d.run()
        assert d.generated == {"A": case[1], "S": case[3], "R": case[5]}, case
        assert {e.finish_reason for e in d.ended.values()} == {"length"}, case
        assert referenced(d.kv) == 0, case


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
    assert referenced(d.kv) == 0


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


@pytest.mark.parametrize(
    ("aging_seconds", "waited", "first"),
    [
        (5.0, 4.9, "normal"),  # LOW + int(4.9 / 5) = LOW: the normal one goes first
        (5.0, 5.0, "low"),  # LOW + 1 = NORMAL, and it arrived first
        (5.0, 12.0, "low"),  # LOW + 2 = HIGH
        (0.0, 1000.0, "normal"),  # aging off: priority alone
    ],
)
def test_a_low_priority_request_that_waited_long_enough_is_admitted_ahead_of_a_later_normal_one(aging_seconds, waited, first):
    """One seat (max_num_seqs=1), held by "busy". "low" queues, then `waited` seconds later on
    the scheduler's clock "normal" queues; when the seat frees, the effective priority
    (priority + one level per aging_seconds waited) picks who takes it."""
    d = Driver(64, max_num_seqs=1, aging_seconds=aging_seconds)
    d.add("busy", [1, 2, 3], 2, Priority.NORMAL)  # arrives at 1
    assert d.step() == [("busy", 3)]
    d.add("low", [4, 5, 6], 1, Priority.LOW)  # arrives at 2
    d.now += waited - 1
    d.add("normal", [7, 8, 9], 1, Priority.NORMAL)  # arrives at 2 + waited
    assert d.now == 2 + waited
    assert d.step() == [("busy", 1)]  # busy's last token: nobody else may run beside it
    assert d.step() == [(first, 3)]
    second = "low" if first == "normal" else "normal"
    assert d.step() == [(second, 3)]
    assert not d.sched.has_work
    assert {r: e.finish_reason for r, e in d.ended.items()} == {"busy": "length", "low": "length", "normal": "length"}


def test_aging_lifts_a_waiting_request_no_higher_than_urgent():
    """Aging stops at URGENT: a low request that arrived half a second before an urgent one and
    has waited as long catches up with it (both rank URGENT), so the earlier arrival goes
    first. Were there no cap, the urgent one would stay three levels ahead."""
    d = Driver(64, max_num_seqs=1, aging_seconds=1.0)
    d.add("busy", [1, 2, 3], 2, Priority.NORMAL)
    assert d.step() == [("busy", 3)]
    d.add("urgent", [4, 5, 6], 1, Priority.URGENT)  # arrives at 2
    d.now = 0.5
    d.add("low", [7, 8, 9], 1, Priority.LOW)  # arrives at 1.5, earlier than "urgent"
    d.now = 100.0  # low has waited 98.5 s: 98 levels, capped at URGENT; urgent too is URGENT
    d.step()
    assert d.step() == [("low", 3)]  # equal rank, earlier arrival


def step_once(d: Driver, sampled: dict[str, int], failed: dict[str, str] | None = None) -> list[RequestOutput]:
    """One step whose rows sample the given tokens (rows not named get none)."""
    out = d.sched.schedule()
    result = RunResult(sampled={r: Sample(t) for r, t in sampled.items()}, failed=failed or {})
    return d.sched.update(out.rows, result)


def stop_driver(**params: object) -> Driver:
    d = Driver(64, eos_token_ids=(2, 9), max_context=12)
    d.sched.add(Request("r", [5, 6, 7], SamplingParams(**params), 5, Priority.NORMAL, 0.0))
    return d


@pytest.mark.parametrize(
    ("params", "tokens", "expected"),
    [
        ({}, [4, 9], ([4, 9], "stop")),  # the second of the model's EOS ids
        ({"ignore_eos": True}, [4, 9, 2, 3, 3], ([4, 9, 2, 3, 3], "length")),  # max_tokens (5) reached
        ({"ignore_eos": True, "stop_token_ids": (9,)}, [4, 9], ([4, 9], "stop")),  # stop ids hold under ignore_eos
        ({"stop_token_ids": (3,)}, [4, 4, 4, 4, 3], ([4, 4, 4, 4, 3], "stop")),  # a stop on the last allowed token is a stop
    ],
)
def test_a_request_ends_at_eos_a_stop_token_or_its_length(params, tokens, expected):
    d = stop_driver(**params)
    outputs = [o for t in tokens for o in step_once(d, {"r": t})]
    assert [t for o in outputs for t in o.new_token_ids] == expected[0]
    assert [o.finished for o in outputs] == [False] * (len(expected[0]) - 1) + [True]
    assert outputs[-1].finish_reason == expected[1]
    assert not d.sched.has_work and referenced(d.kv) == 0


def test_a_request_ends_with_length_where_the_context_is_full():
    """max_context 6, prompt 3: the third generated token fills the context (max_tokens is 5)."""
    d = Driver(64, max_context=6)
    d.sched.add(Request("r", [5, 6, 7], SamplingParams(ignore_eos=True), 5, Priority.NORMAL, 0.0))
    outputs = [o for t in (4, 4, 4) for o in step_once(d, {"r": t})]
    assert [o.finish_reason for o in outputs] == [None, None, "length"]
    assert not d.sched.has_work


def test_a_row_whose_sampling_failed_ends_its_request_with_error_and_the_others_go_on():
    d = Driver(64)
    d.add("ok", [1, 2, 3], 2, Priority.NORMAL)
    d.add("bad", [4, 5, 6], 2, Priority.NORMAL)
    outputs = step_once(d, {"ok": 11}, failed={"bad": "Traceback: boom"})
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs] == [("ok", [11], None), ("bad", [], "error")]
    assert outputs[1].error == "request bad: sampling failed:\nTraceback: boom"
    assert d.sched.has_request("ok") and not d.sched.has_request("bad")
    assert d.kv.num_blocks_in(d.sched.requests["ok"].seq_id, Tier.DEVICE) == 1
    assert step_once(d, {"ok": 12})[0].finish_reason == "length"
    assert referenced(d.kv) == 0


def test_a_prefill_chunk_never_cuts_an_image():
    """Image tokens 5..12 of a 20-token prompt, chunks of at most 8: the first chunk stops before
    the image, the next runs it whole; while B decodes and 6 prefill tokens fit a step, the image
    waits for a step with room (B's decodes go on)."""
    span = ImageSpan(5, 13, ImageInput(np.zeros((1, 1, 3), np.uint8)))
    d = Driver(64, prefill_chunk=8)
    d.add("A", list(range(20)), 1, Priority.NORMAL, (span,))
    assert [d.step() for _ in range(3)] == [[("A", 5)], [("A", 8)], [("A", 7)]]

    d = Driver(64, prefill_chunk=8, prefill_with_decodes=6)
    d.add("B", [1, 2, 3], 3, Priority.HIGH)
    d.step()  # B's prompt; it decodes from now on
    d.add("A", list(range(20)), 1, Priority.NORMAL, (span,))
    assert [d.step() for _ in range(4)] == [[("B", 1), ("A", 5)], [("B", 1)], [("A", 8)], [("A", 7)]]


def test_deadlines_end_running_and_waiting_requests_at_the_next_step():
    """Only requests with a deadline are checked for one; a waiting and a running request past
    theirs end with "deadline" at the next step, one without a deadline runs on."""
    d = Driver(num_device_blocks=64, max_num_seqs=2)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    for request_id, deadline in (("running", 3.0), ("plain", None), ("waiting", 2.0)):
        d.sched.add(Request(request_id, [1, 2, 3], params, 50, Priority.NORMAL, 0.0, deadline=deadline))
        d.generated[request_id] = 0
    assert sorted(r for r, _ in d.step()) == ["plain", "running"]  # "waiting" waits: max_num_seqs is 2
    d.now = 2.5
    out = d.sched.schedule()
    assert [(o.request_id, o.finish_reason) for o in out.finished] == [("waiting", "deadline")]
    assert sorted(r.request_id for r in out.rows) == ["plain", "running"]
    d.sched.update(out.rows, RunResult(sampled={r.request_id: Sample(7) for r in out.rows}))
    d.now = 3.5
    out = d.sched.schedule()
    assert [(o.request_id, o.finish_reason) for o in out.finished] == [("running", "deadline")]
    assert [r.request_id for r in out.rows] == ["plain"] and list(d.sched.requests) == ["plain"]


def test_a_sequence_past_longropes_switch_is_prefilled_again_in_one_chunk():
    """LongRoPE switching at 10 tokens: a, 6 prompt tokens, decodes to 10 tokens, then its 11th
    position would take the long factors beside short-factor keys, so it runs its 11 tokens again in
    one chunk (over the prefill chunk of 4); b, 12 prompt tokens, starts past the switch: its first
    11 in one chunk. c, 3 tokens, stays inside and is never recomputed."""
    d = Driver(64, max_num_batched_tokens=8, prefill_with_decodes=4, prefill_chunk=4)
    d.sched = Scheduler(d.sched.config.with_long_rope(10), d.kv, clock=lambda: d.now)
    assert (d.sched.config.prefill_chunk, d.sched.config.max_num_batched_tokens) == (11, 11 + 64)
    d.add("a", list(range(6)), 8, Priority.NORMAL)
    d.add("c", list(range(50, 53)), 8, Priority.NORMAL)
    assert d.step() == [("a", 6), ("c", 3)]
    assert [d.step() for _ in range(4)] == [[("a", 1), ("c", 1)]] * 4  # a: 10 tokens, 10 computed
    assert d.step() == [("c", 1), ("a", 11)]  # a's 11th position: recomputed whole, c decodes on
    assert d.sched.stats.num_long_rope_recomputes == 1
    d.add("b", list(range(20, 32)), 2, Priority.NORMAL)
    assert d.step() == [("a", 1), ("c", 1), ("b", 11)]
    assert d.step() == [("a", 1), ("c", 1), ("b", 1)]  # b: its 12th prompt token
    d.run()
    assert d.generated == {"a": 8, "b": 2, "c": 8} and d.sched.stats.num_long_rope_recomputes == 1


def test_long_rope_blocks_hash_apart_from_short_ones():
    short = Request("s", list(range(12)), SamplingParams(), 1, Priority.NORMAL, 0.0)
    long = Request("l", list(range(12)), SamplingParams(), 1, Priority.NORMAL, 0.0, whole_until=11)
    assert short.extra_keys(BS) == {} and long.extra_keys(BS) == {0: b"long-rope"}
    long.num_computed = 4  # a cached prefix: the rest of the first 11 tokens still runs whole
    assert (long.chunk(6), long.chunk(7), long.chunk(8)) == (0, 7, 8)


def test_decode_rows_that_fill_a_block_put_it_in_the_prefix_cache():
    """`update` commits a row's tokens only where they fill a block (BlockGroups.fills_a_block): the
    blocks that decode rows fill still enter the prefix cache, each at the step that fills it."""
    from wicore.blocks.sequence_blocks import prefix_hashes

    d = Driver(num_device_blocks=64)
    prompt = list(range(20, 30))  # 10 tokens: the prefill fills blocks 0 and 1
    d.add("a", prompt, 9, Priority.NORMAL)
    pool = d.kv.full.pool
    tokens = prompt + [7] * 9
    hashes = prefix_hashes(tokens[:17], BS)  # blocks 0..3: 18 tokens run (the last output never is)
    cached = []
    while d.sched.has_work:
        d.step()
        cached.append(sum(pool.is_cached(h) for h in hashes))
    # after the prefill 2; block 2 fills at the row of position 11, block 3 at 15
    assert cached == [2, 2, 3, 3, 3, 3, 4, 4, 4]
    assert pool.num_evictable(Tier.DEVICE) == 4  # block 4 (positions 16, 17) was never full: retired
