"""The engine core's steps that overlap the device (wicore.engine.core), and the accounting every
step shares:

    async scheduling   _step_async: step N+1 scheduled and queued behind N (wicore.engine.lookahead)
                       while N runs; N accounted after
    pipeline groups    _step_groups: a step launched for the requests not in flight while the
                       others' step runs (wicore.engine.groups)
    every step         _account (a result into the requests and the KV statistics), _trace

A mixin of EngineCore: it reads and changes the core's scheduler, runner and KV cache, declared below.
"""

from __future__ import annotations

import time
import traceback

from wicore.engine.groups import StepGroups
from wicore.engine.lookahead import InFlight, StepWorker
from wicore.engine.rate import RateMeter
from wicore.engine.scheduler import Scheduler
from wicore.engine.trace import PhaseSeconds, StepTrace
from wicore.executor.runner import ModelRunner
from wicore.kv.cache import KVCache
from wicore.types.outputs import RequestOutput
from wicore.types.step import RunResult, ScheduledRow, SchedulerOutput

Accountable = tuple[list[ScheduledRow], RunResult]  # a step's rows that still count, and its result


class OverlappedSteps:
    scheduler: Scheduler
    runner: ModelRunner
    kv: KVCache
    generated: RateMeter
    num_steps: int
    last_step: StepTrace
    seconds: PhaseSeconds
    _inflight: InFlight | None

    def _account(self, rows: list[ScheduledRow], result: RunResult) -> list[RequestOutput]:
        """A step's result into the KV statistics and the requests: their outputs."""
        for row in rows:  # A2CR: where each row's attention went
            mass = result.attention.get(row.request_id)
            if mass is not None:
                self.kv.record_attention(row.block_ids, mass.tolist())
        self.generated.add(len(result.sampled) + sum(len(v) for v in result.verified.values()))
        return self.scheduler.update(rows, result)

    def _step_async(self, worker: StepWorker) -> list[RequestOutput]:
        """`step` under async scheduling (wicore.engine.lookahead): with a step N in flight, schedule,
        build and queue N+1 behind it (its fed rows take N's sampled ids on the worker), then wait for
        N and account for it; where N+1 cannot be planned before N's result, account for N first and
        schedule N+1 after, as without. Returns N's outputs; aborts and deadlines are applied before
        N's tokens, so an aborted request sends none after the abort, as without."""
        start = time.perf_counter()
        inflight, self._inflight = self._inflight, None
        outputs: list[RequestOutput] = []
        ahead = inflight is not None and self._plan_ahead(inflight)
        if inflight is None or ahead:
            busy = inflight.request_ids if inflight is not None else set()
            outputs += self._launch_async(worker, self.scheduler.schedule(busy=busy, ahead=True), inflight)
        scheduled = time.perf_counter()
        if inflight is None:
            self._trace(StepTrace(seconds=PhaseSeconds(schedule_s=scheduled - start)))
            return outputs
        waited, result = self._wait(inflight, outputs)
        if result is not None:
            outputs += self._account(result[0], result[1])
        accounted = time.perf_counter()
        if not ahead:  # N+1 could not be planned before N's result: scheduled now, as without the flag
            outputs += self._launch_async(worker, self.scheduler.schedule(), None)
        graphs_s = 0.0 if result is None else result[1].graphs_seconds
        schedule_s = scheduled - start + time.perf_counter() - accounted
        seconds = PhaseSeconds(schedule_s, 0.0, waited - scheduled, accounted - waited, graphs_s)
        self._trace(StepTrace(tuple(inflight.rows), seconds=seconds))
        return outputs

    def _plan_ahead(self, inflight: InFlight) -> bool:
        """Plan N+1's fed rows while N runs; whether N+1 may be scheduled before N's result."""
        if self.runner.offloader is not None:  # staged rows copy blocks on the engine thread
            return False
        return self.scheduler.plan_ahead(inflight.rows, inflight.step.fed.keys())

    def _launch_async(self, worker: StepWorker, out: SchedulerOutput, after: InFlight | None) -> list[RequestOutput]:
        """Prepare `out`'s rows and queue them on the worker behind `after` (its KV moves there too,
        once `after` is done with the blocks): the step in flight from now on. Returns the requests
        that ended while scheduling, and those of a step that failed to prepare."""
        outputs = list(out.finished)
        if not out.rows and not out.moves:
            return outputs
        try:
            feeds = after.step.fed if after is not None else {}
            step = self.runner.prepare(out.rows, out.ended_request_ids, feeds)
            self._inflight = worker.launch(out.rows, step, out.moves, after)
            if after is None:  # nothing runs before it: the held requests are its own at once
                self.scheduler.hold(self._inflight.request_ids)
            self.num_steps += bool(out.rows)
        except Exception:
            outputs += self.scheduler.fail([row.request_id for row in out.rows], traceback.format_exc())
        return outputs

    def _wait(self, inflight: InFlight, outputs: list[RequestOutput]) -> tuple[float, Accountable | None]:
        """Wait for `inflight`: the blocks it held go back, the step queued behind it (if any) holds its
        own; aborts and deadlines are applied (their outputs, and a failed step's, into `outputs`).
        When it waited, and the rows to account with their result (None: the step failed)."""
        error = None
        try:
            launched = inflight.result.result()
        except Exception:
            inflight.step.masks.wait()
            error = traceback.format_exc()
        waited = time.perf_counter()
        self.scheduler.release()
        self.scheduler.hold(self._inflight.request_ids if self._inflight is not None else ())
        if error is not None:
            outputs += self.scheduler.fail([row.request_id for row in inflight.rows], error)
            return waited, None
        outputs += self.scheduler.drop_cancelled()
        rows = self.scheduler.drop_lost(launched.lost, inflight.rows) if launched.lost else inflight.rows
        return waited, (rows, self.runner.finish(inflight.step, launched.device))

    def _step_groups(self, groups: StepGroups) -> list[RequestOutput]:
        """`step` with steps in flight over groups of requests (wicore.engine.groups): launch a step
        for the requests not in flight, after waiting for the oldest step when every group is busy
        (or none of the others can run). Returns the outputs of the steps accounted, and the requests
        that ended while scheduling."""
        start = time.perf_counter()
        outputs: list[RequestOutput] = []
        trace = StepTrace()
        if not groups.is_full and self._launch_group(groups, outputs):
            self._trace(StepTrace(seconds=PhaseSeconds(schedule_s=time.perf_counter() - start)))
            return outputs
        if groups.inflight:
            inflight = groups.oldest()
            waiting = time.perf_counter()
            result = None
            try:
                result = inflight.result.result()
            except Exception:
                outputs += self.scheduler.fail([row.request_id for row in inflight.rows], traceback.format_exc())
            ran = time.perf_counter()
            outputs += self.scheduler.drop_cancelled(groups.busy())
            if result is not None:
                outputs += self._account(inflight.rows, result)
            graphs_s = 0.0 if result is None else result.graphs_seconds
            seconds = PhaseSeconds(waiting - start, 0.0, ran - waiting, time.perf_counter() - ran, graphs_s)
            trace = StepTrace(tuple(inflight.rows), seconds=seconds)
            self._launch_group(groups, outputs)
        self._trace(trace)
        return outputs

    def _launch_group(self, groups: StepGroups, outputs: list[RequestOutput]) -> bool:
        """Schedule the requests not in flight, up to an even share of the live ones, and launch
        them as a step; the requests that ended go to `outputs`. Whether a step was launched."""
        share = -(-self.scheduler.num_requests // groups.num_groups)  # the groups even out within a round
        out = self.scheduler.schedule(busy=groups.busy(), max_rows=max(share, 1))
        outputs += out.finished
        try:
            lost = self.kv.execute(out.moves) if out.moves else set()
            rows = self.scheduler.drop_lost(lost, out.rows) if lost else out.rows
            if rows:
                groups.launch(rows, out.ended_request_ids)
                self.num_steps += 1
                return True
        except Exception:
            outputs += self.scheduler.fail([row.request_id for row in out.rows], traceback.format_exc())
        groups.forget(out.ended_request_ids)
        return False

    def _trace(self, trace: StepTrace) -> None:
        self.last_step = trace
        self.seconds += trace.seconds
