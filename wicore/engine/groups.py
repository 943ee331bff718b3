"""Steps in flight over disjoint groups of requests (EngineConfig.pipeline_groups, off by default):
with the model's partitions on several devices, every device busy at decode too (vLLM's "virtual
engines").

A decode step reads every weight once whatever its rows, so cutting one step into micro-batches
(wicore.executor.pipeline) costs about (M + S - 1) / S of a whole step. Instead, the running
requests form S groups, each with a step of its own in flight; the partitions' workers take the
steps in the order they come, so while cuda:1 runs group A's step n, cuda:0 already runs group B's:

    cuda:0  │ A n │ B n │ A n+1 │ B n+1 │
    cuda:1        │ A n │ B n   │ A n+1 │ B n+1 │

Each group's step keeps its full rows, so each device reads its weights once a group step and
neither idles. The engine thread, at each `EngineCore.step`:

    if S steps are in flight (or nothing else can run): wait for the oldest, drop the aborted and
        expired requests that are not in flight, account it (steps are accounted in launch order)
    schedule the requests that are not in flight (at most 1/S of the live requests, so the groups
    stay even), and launch them as a step

A request is in at most one step in flight: the scheduler is told which are busy and leaves them
alone (no row, no preemption, no abort until their step is back). New requests join the group
whose step is scheduled next.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from wicore.executor.runner import ModelRunner
from wicore.types.step import RunResult, ScheduledRow


@dataclass(frozen=True)
class GroupStep:
    """A group's step in flight: its rows and the result to come."""

    rows: list[ScheduledRow]
    result: Future[RunResult]


class StepGroups:
    """Up to `num_groups` launched steps, each on a thread of its own (their partitions' runs are
    queued on the pipeline's workers), returned oldest first."""

    def __init__(self, runner: ModelRunner, num_groups: int) -> None:
        if num_groups < 2:
            raise ValueError(f"steps in flight over groups need at least 2 groups, got {num_groups}")
        self.runner = runner
        self.num_groups = num_groups
        self.inflight: deque[GroupStep] = deque()
        self._ended: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=num_groups, thread_name_prefix="wicore-group")

    @property
    def is_full(self) -> bool:
        return len(self.inflight) >= self.num_groups

    def busy(self) -> set[str]:
        """The requests with a row in a step in flight."""
        return {row.request_id for step in self.inflight for row in step.rows}

    def launch(self, rows: list[ScheduledRow], ended_request_ids: list[str]) -> None:
        """Run `rows` on a thread of their own; `ended_request_ids` (and those of schedules that
        launched nothing) lose their samplers first."""
        ended, self._ended = self._ended + ended_request_ids, []
        self.inflight.append(GroupStep(rows, self._pool.submit(self.runner.execute, rows, ended)))

    def forget(self, ended_request_ids: list[str]) -> None:
        """Requests that ended in a schedule that launched no step: the next launch drops their samplers."""
        self._ended += ended_request_ids

    def oldest(self) -> GroupStep:
        """The oldest step in flight, no longer counted as such (its result may still be coming)."""
        return self.inflight.popleft()

    def close(self) -> None:
        """Wait for the steps in flight and end the threads."""
        self._pool.shutdown(wait=True)
