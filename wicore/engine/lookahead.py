"""Async scheduling (EngineConfig.async_scheduling): step N+1 is scheduled, built and queued on the
worker while step N runs there, and N's result is accounted while N+1 runs, as vLLM's async
scheduling does.

    engine thread   plan N+1 ─► schedule N+1 ─► prepare N+1 ─► queue N+1 ─► wait N ─► account N ─┐ (caller: N's outputs)
    worker thread   ═══ graphs N ═══ N's ids ─► feed N+1 ─► ═══ graphs N+1 ═══ ...                 │
                                                            plan N+2 ─► ... ─► wait N+1 ◄──────────┘

The worker runs only the ONNX Runtime runs (they release the GIL) and the array copies around them
(ModelRunner.run_device, wicore.executor.prepared); the batch is built, the captured inputs written
and the tokens sampled on the host by the engine thread, so the device waits for no Python of the
engine's between two steps as long as the engine's part of a step is shorter than the device's.

The GIL's switch interval. When N's run returns, the worker needs the GIL for a fraction of a
millisecond (read N's ids, feed and launch N+1) while the engine thread, busy in Python, holds it;
Python hands it over only after the switch interval, 5 ms by default, and the device idles that
long each step (seen on an H200, docs/PERFORMANCE.md). While a worker runs, the interval is
SWITCH_INTERVAL_S (environment WICORE_ASYNC_SWITCH_INTERVAL_S to try others), restored on close.

Planned ahead (`Scheduler.plan_ahead`) is each decode row whose input is a token the step in flight
decides on the device (a fed row: the graph's argmax, or the sampling head's whole-distribution
draw) and that `can_plan_ahead`: its blocks appended, its input written by the worker from N's
sampled ids right before N+1's graphs. The requests not in flight (waiting, swapped, running but
not in N) are scheduled beside them as without the flag, and the schedule makes the plain engine's
choices where it can know them before N's result (`Scheduler.schedule(ahead=True)`): the fed rows
count as decodes, rows go in rank order, a prompt N finishes holds back no request sharing it.

A request that N ends (EOS, a stop token, a stop string, an abort) still has its row in N+1, as in
vLLM: that row's token is dropped, the request's final output is sent when N is accounted (so it
sends exactly what it sends without the flag), and its blocks go back once N+1 returns
(`Scheduler.hold`), since N+1 writes and reads them. A request's last token by max_tokens is known
in advance: no row is planned after it. A step N that raises fails its requests, as without the flag;
N+1, queued behind it, still runs for the others (its fed rows are N's requests': their inputs stay
placeholders and their rows are dropped, as an ended request's are).

Synchronous steps. Where a request of N goes on after it but its next row cannot be planned (its
token is sampled on the host: a grammar, penalties or a logit bias, logprobs, top-k / top-p from the
head's candidates, a host-sampled batch; a prefill chunk with more to come; no KV room), N+1 is
scheduled only after N's result, as without the flag (it still runs on the worker, so the caller's
handling of N's outputs overlaps it). So are steps of an engine that offloads KV to the host
(`kv_offload_tokens`); speculative decoding does not combine with async scheduling.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from wicore.blocks.block_pool import Move
from wicore.engine.request import Request, Status
from wicore.executor.prepared import DeviceResult, PreparedStep
from wicore.executor.runner import ModelRunner
from wicore.kv.cache import KVCache
from wicore.types.step import ScheduledRow

SWITCH_INTERVAL_S = 1e-4  # the GIL's switch interval while a StepWorker runs (the module docstring)
SWITCH_INTERVAL_ENV = "WICORE_ASYNC_SWITCH_INTERVAL_S"


def switch_interval() -> float:
    """The GIL switch interval for async scheduling: the environment's, else SWITCH_INTERVAL_S."""
    value = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    try:
        seconds = float(value) if value else SWITCH_INTERVAL_S
    except ValueError:
        raise ValueError(f"{SWITCH_INTERVAL_ENV}={value!r}: give seconds, e.g. 0.0001") from None
    if seconds <= 0:
        raise ValueError(f"{SWITCH_INTERVAL_ENV}={value!r}: give seconds > 0")
    return seconds


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
class Launched:
    """What a step's job on the worker gave: the sequences whose KV its moves lost, and the runs' result."""

    lost: set[int]
    device: DeviceResult


@dataclass(frozen=True)
class InFlight:
    """A step queued on the worker: its rows, its prepared batches and the result to come."""

    rows: list[ScheduledRow]
    step: PreparedStep
    result: Future[Launched]

    @property
    def request_ids(self) -> set[str]:
        return {row.request_id for row in self.rows}


class StepWorker:
    """One thread that runs queued steps on the device, one at a time and in order: a step's KV moves,
    its fed input ids from the step before it, its graphs. The scheduler, the KV bookkeeping, batch
    building and sampling stay the engine thread's."""

    def __init__(self, runner: ModelRunner, kv: KVCache) -> None:
        self.runner = runner
        self.kv = kv
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wicore-step")
        self._switch_interval = sys.getswitchinterval()  # restored on close
        sys.setswitchinterval(switch_interval())

    def launch(self, rows: list[ScheduledRow], step: PreparedStep, moves: list[Move], after: InFlight | None) -> InFlight:
        """Queue `step` (prepared from `rows`) behind `after`, the step in flight whose sampled ids its
        fed rows take; `moves` run first, once `after` is done with the blocks they touch."""
        return InFlight(rows, step, self._pool.submit(self._run, step, moves, after))

    def _run(self, step: PreparedStep, moves: list[Move], after: InFlight | None) -> Launched:
        previous = None
        if after is not None:
            try:
                previous = after.result.result().device  # done: the worker ran it
            except Exception:  # the engine fails `after`'s requests when it waits for it (EngineCore._wait)
                # This step still runs for the others. Its fed rows are all of `after`'s requests, which
                # end with `after`'s error before this step is accounted: their placeholder inputs stay.
                previous = DeviceResult([], np.zeros(len(after.step.fed), np.int64), 0.0)
        lost = self.kv.execute(moves) if moves else set()
        return Launched(lost, self.runner.run_device(step, previous))

    def close(self) -> None:
        """Wait for the steps in flight (if any), end the thread, restore the GIL's switch interval."""
        self._pool.shutdown(wait=True)
        sys.setswitchinterval(self._switch_interval)
