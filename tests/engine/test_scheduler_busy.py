"""The scheduler with steps in flight (wicore.engine.groups): the requests in flight get no row and are
never preempted or ended until their step is back, and a step takes at most `max_rows` rows."""

from __future__ import annotations

from test_scheduler import Driver

from wicore.types.outputs import Priority
from wicore.types.sampling import Sample
from wicore.types.step import RunResult


def test_requests_in_flight_are_left_alone_and_rows_are_capped():
    d = Driver(num_device_blocks=64)
    for i in range(4):
        d.add(f"r{i}", [10 + i] * 6, 5, Priority.NORMAL)
    a = d.sched.schedule(max_rows=2)  # group A: the two best-ranked requests, whole prompts
    assert [(r.request_id, len(r.token_ids)) for r in a.rows] == [("r0", 6), ("r1", 6)]
    b = d.sched.schedule(busy={"r0", "r1"}, max_rows=2)  # group B, while A is in flight
    assert [r.request_id for r in b.rows] == ["r2", "r3"]
    assert d.sched.schedule(busy={"r0", "r1", "r2", "r3"}).rows == []  # nothing is left to run
    d.sched.abort("r0")  # aborted in flight: it ends once its step is back, not before
    assert d.sched.schedule(busy={"r0", "r1", "r2", "r3"}).finished == []
    assert d.sched.drop_cancelled(busy={"r0", "r1", "r2", "r3"}) == []
    d.sched.update(a.rows, RunResult(sampled={r.request_id: Sample(7) for r in a.rows}))  # A is back
    ended = d.sched.drop_cancelled(busy={"r2", "r3"})
    assert [(o.request_id, o.finish_reason) for o in ended] == [("r0", "abort")]
    again = d.sched.schedule(busy={"r2", "r3"}, max_rows=2)
    assert [(r.request_id, r.start, len(r.token_ids)) for r in again.rows] == [("r1", 6, 1)]


def test_a_fed_row_of_a_prompt_in_flight_takes_a_decode_token_not_a_prefill_one():
    """Async scheduling: the step after a prompt's prefill is planned before that prefill returns, so
    its request's computed count still says "prompt to run"; its fed decode row must take one token
    of the step but none of the prefill tokens, or the chunks beside it are cut shorter than the
    plain engine cuts them (on a GPU other batches round otherwise and sampled tokens move)."""
    config = dict(max_num_batched_tokens=20, prefill_chunk=20, prefill_with_decodes=8)
    plain, ahead = Driver(num_device_blocks=64, **config), Driver(num_device_blocks=64, **config)
    rows = {}
    for name, d in (("plain", plain), ("ahead", ahead)):
        for i in range(3):
            d.add(f"r{i}", [10 + i] * 10, 5, Priority.NORMAL)
        first = d.sched.schedule()  # r0 and r1 prefill whole (20 tokens), r2 waits
        assert [(r.request_id, len(r.token_ids)) for r in first.rows] == [("r0", 10), ("r1", 10)]
        sampled = RunResult(sampled={r.request_id: Sample(7) for r in first.rows})
        if name == "plain":
            d.sched.update(first.rows, sampled)
            second = d.sched.schedule()
        else:  # the next step, scheduled while the first is in flight
            assert d.sched.plan_ahead(first.rows, {"r0", "r1"})
            second = d.sched.schedule(busy={"r0", "r1"}, ahead=True)
        rows[name] = [(r.request_id, r.start, len(r.token_ids)) for r in second.rows]
    # two decodes and r2's first chunk: prefill_with_decodes' 8 tokens, all of them
    assert rows["ahead"] == rows["plain"] == [("r0", 10, 1), ("r1", 10, 1), ("r2", 0, 8)]


def test_rows_planned_ahead_are_the_rows_built_in_full():
    """Async scheduling: a fed row whose request's blocks did not change since its row in flight is that
    row one position on (Scheduler.plan_ahead); it, and every other planned row, must equal the row
    built in full (`build_row`) at the moment it is scheduled: tables, window, logits, parameters. The
    workload crosses blocks (4 tokens) and the window (8 tokens: the window group releases blocks)."""
    from wicore.blocks.block_groups import BlockGroups
    from wicore.blocks.block_pool import BlockPool
    from wicore.blocks.policy import LRUPolicy
    from wicore.engine.rows import build_row

    d = Driver(num_device_blocks=64)
    d.kv = d.sched.kv = BlockGroups(BlockPool(64, 0, 0, 4, LRUPolicy(), group=0), BlockPool(32, 0, 0, 4, LRUPolicy(), group=1), 8)
    for i, (n, new) in enumerate([(6, 14), (9, 11), (13, 5), (3, 17)]):
        d.add(f"r{i}", [10 + i] * n, new, Priority.NORMAL)
    inflight = d.sched.schedule()
    starts, kept = [], []
    while inflight.rows:
        busy = {r.request_id for r in inflight.rows}
        assert d.sched.plan_ahead(inflight.rows, {r.request_id for r in inflight.rows if r.needs_sample})
        ahead = d.sched.schedule(busy=busy, ahead=True)
        before = {r.request_id: r for r in inflight.rows}
        for row in ahead.rows:
            assert row.fed and row == build_row(d.kv, d.sched.requests[row.request_id], 1, ahead=True)
            starts.append(row.start)
            if row.block_table is before[row.request_id].block_table:  # the row in flight's tables, kept
                kept.append(row.start)
        d.sched.update(inflight.rows, RunResult(sampled={r.request_id: Sample(7) for r in inflight.rows if r.needs_sample}))
        inflight = ahead
    assert not d.sched.has_work
    # every decode row after a request's first was planned (the prefills: 6, 9, 13 and 3 tokens)
    assert sorted(starts) == sorted([*range(6, 19), *range(9, 19), *range(13, 17), *range(3, 19)])
    # built in full: the first after each prefill (6, 9, 13, 3), those that start a block (8, 12, 16;
    # 12, 16; 16; 4, 8, 12, 16) and those whose window leaves a block (11, 15 each; r2's 13 and 15)
    assert sorted(kept) == sorted([7, 9, 10, 13, 14, 17, 18, 10, 13, 14, 17, 18, 14, 5, 6, 7, 9, 10, 13, 14, 17, 18])
