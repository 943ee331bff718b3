"""The steady decode step: the engine core's shortcut for a step that repeats the last one a token on.

In a long generation most steps run the same requests as the step before, each one token further.
Such a step needs no ranking or budgets, no batch built from lists, no plan of which rows are drawn,
fed or read back: the last step's rows advance a position, its batch too, a row's tables written
anew only where it got a block or released one (a tiny model's step spent ~0.25-0.5 ms of ~1.3 in
that host work, issue 37; the steady step halves it). The core keeps the last step where the next
may repeat it:

    step N (any path)    rows, batch ──► run ──► update ──► steady_after: N's rows cover the running
                                                               requests, all plain decodes? keep N
    step N+1             Scheduler.repeat_decodes(N's rows) ──► None: schedule as always
                           └─ rows one token on ──► ModelRunner.repeat(N's batch) ──► run ──► update

Both checks are exact (tokens equal to the full path's, tests/engine/test_steady_decode.py): the scheduler
answers rows only where `schedule` would give the same rows, moves and endings
(wicore.engine.scheduler_steady), the runner repeats only a step of plain decode rows
(ModelRunner.can_repeat), and `repeat` builds what `prepare` would from the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wicore.engine.request import Request
from wicore.engine.scheduler import Scheduler
from wicore.executor.prepared import PreparedStep
from wicore.types.step import RunResult, ScheduledRow


@dataclass(frozen=True)
class SteadyStep:
    """A step the next may repeat: its prepared batch, and the running requests it left (in order)."""

    step: PreparedStep
    running: tuple[Request, ...]

    @property
    def rows(self) -> Sequence[ScheduledRow]:
        return self.step.rows


def steady_after(scheduler: Scheduler, step: PreparedStep, result: RunResult, repeated: bool) -> SteadyStep | None:
    """`step` (one ModelRunner.can_repeat accepts, accounted) to repeat next, where its rows are every
    running request's and none failed; else None. `repeated`: `step` repeated the step before, whose
    rows were every running request's in rank order: none has joined since, so as many as its rows are
    all of them, in that order."""
    running = tuple(scheduler.running)
    if result.failed or len(running) != len(step.rows):
        return None
    if not repeated and (
        {r.request_id for r in running} != {row.request_id for row in step.rows} or not scheduler.in_rank_order(step.rows)
    ):
        return None
    return SteadyStep(step, running)
