"""Async scheduling (EngineConfig.async_scheduling): the engine's thread plans step N+1 while step N
runs on a worker thread (ONNX Runtime's run releases the GIL).

    engine thread   plan N+1 ─► wait N ─► drop aborts ─► account N ─► schedule N+1 ─► launch N+1 ─┐  (caller: N's outputs)
    worker thread   ══ graphs N ══ sample N                                        batch N+1 ──┴─► graphs N+1 ...

`launch` returns once the worker's graphs start: building the batch is Python, which would only
take turns with the engine thread's on the GIL, while the graphs' run releases it.

Planned ahead (`Scheduler.plan_ahead`) is each decode row whose request's next token is the one N
samples: its KV blocks are appended and its row built while N runs, with an empty input that the
schedule after N fills from the request's tokens. N+1 is launched only after N's result is in,
so its inputs are always real tokens; what overlaps the device is the per-row block bookkeeping of
N+1 and whatever the caller does with N's outputs (streaming, detokenizing) while N+1 runs.

Not planned ahead (`can_plan_ahead`): rows whose next input is not simply N's token, or whose
sampling depends on what is still to come back: a grammar (its state advances with N's token), a
penalty or logit bias (they count the outputs), prompt logits, a row still prefilling (no token
sampled), a verification row (speculative decoding does not combine with async scheduling),
an offloaded row, and the request's last token by max_tokens. The ordinary schedule after N takes
those, so one step mixes both kinds. A request that N ends (EOS, a stop token, max_tokens, an
abort, a failure) never runs its planned row: it is dropped before N+1 launches, with the blocks
appended for it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from wicore.engine.request import Request, Status
from wicore.executor.runner import ModelRunner
from wicore.types.step import RunResult, ScheduledRow


def can_plan_ahead(req: Request, row: ScheduledRow) -> bool:
    """Whether `req`'s next decode row may be planned while `row` (its row in the step in flight) runs."""
    p = req.params
    if not row.needs_sample or row.draft_ids or row.full_locations:  # prefilling, verifying, offloaded
        return False
    if req.grammar is not None or p.changes_logits or p.prompt_logits:  # sampling that follows the outputs
        return False
    if req.status is not Status.RUNNING or row.start + len(row.token_ids) != req.num_tokens:
        return False
    return req.num_output_tokens + 1 < req.max_tokens  # else the token in flight is its last


@dataclass(frozen=True)
class InFlight:
    """A step launched on the worker: its rows and the result to come."""

    rows: list[ScheduledRow]
    result: Future[RunResult]


class StepWorker:
    """One thread that runs launched steps through the runner, one at a time and in order. The
    runner is this thread's alone while a step is in flight; the scheduler and KV bookkeeping stay
    the engine thread's."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wicore-step")

    def launch(self, rows: list[ScheduledRow], ended_request_ids: list[str]) -> InFlight:
        """Run `rows` on the worker; returns once their graphs start (or the step ended): the
        batch building before them is Python, which would only take turns with the engine
        thread's on the GIL, while the graphs' run releases it."""
        running = threading.Event()
        result = self._pool.submit(self.runner.execute, rows, ended_request_ids, running)
        result.add_done_callback(lambda _: running.set())
        running.wait()
        return InFlight(rows, result)

    def close(self) -> None:
        """Wait for the step in flight (if any) and end the thread."""
        self._pool.shutdown(wait=True)
