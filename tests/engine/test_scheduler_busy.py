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
