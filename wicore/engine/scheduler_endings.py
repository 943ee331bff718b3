"""How the scheduler's requests end, and a step's accounting: aborts, deadlines, lost KV blocks,
failures, and `update` (new tokens, stops) after a step ran (wicore.engine.scheduler).

A mixin of Scheduler: it reads and changes the scheduler's queues and the KV cache, declared
below. A request sent back to recompute (`_requeue_for_recompute`: preempted, or its KV blocks lost)
goes back to the waiting queue from here."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Collection

from wicore.blocks.block_groups import BlockGroups
from wicore.engine.request import Request, Status
from wicore.engine.samples import take_samples
from wicore.engine.scheduler_config import SchedulerConfig, SchedulerStats
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import Sample
from wicore.types.step import RunResult, ScheduledRow


class SchedulerEndings:
    config: SchedulerConfig
    kv: BlockGroups
    stats: SchedulerStats
    requests: dict[str, Request]
    waiting: list[Request]
    running: list[Request]
    swapped: list[Request]
    _aborted: deque[str]
    _with_deadline: dict[str, Request]
    _ended: list[str]
    _held: set[str]
    _deferred_frees: list[int]

    def _requeue_for_recompute(self, req: Request) -> None:
        """Preempted by recompute: its prompt logits come again with its tokens."""
        req.prompt_logits = []
        self._requeue(req)
        self.stats.num_preempted_recompute += 1

    def _requeue(self, req: Request) -> None:
        """Free the request's blocks; it re-enters the waiting queue and recomputes its tokens."""
        self.kv.free(req.seq_id)
        req.num_computed = 0
        req.status = Status.WAITING
        self.waiting.append(req)

    def _fail(self, req: Request, reason: str) -> RequestOutput:
        return dataclasses.replace(self._finish(req, "error"), error=f"request {req.request_id}: {reason}")

    # -- endings ---------------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> RequestOutput:
        if req.status is not Status.FINISHED:
            queue = {Status.WAITING: self.waiting, Status.RUNNING: self.running, Status.SWAPPED: self.swapped}[req.status]
            if req in queue:  # its status names its queue: one list searched, not three
                queue.remove(req)
            if req.status is not Status.WAITING and req.request_id in self._held:
                self._deferred_frees.append(req.seq_id)  # a step in flight still runs its row
            elif req.status is not Status.WAITING:
                self.kv.free(req.seq_id)
            req.status = Status.FINISHED
            self._ended.append(req.request_id)
        self.requests.pop(req.request_id, None)
        self._with_deadline.pop(req.request_id, None)
        return RequestOutput(req.request_id, [], True, reason, len(req.prompt_ids), req.num_cached_prompt_tokens)

    def _drop_aborted(self, busy: Collection[str] = ()) -> list[RequestOutput]:
        out = []
        waits = []  # aborted while its step is in flight: ended once that step is back
        while self._aborted:
            request_id = self._aborted.popleft()
            req = self.requests.get(request_id)
            if request_id in busy:
                waits.append(request_id)
            elif req is not None:
                out.append(self._finish(req, "abort"))
        self._aborted.extend(waits)
        return out

    def _drop_expired(self, now: float, busy: Collection[str] = ()) -> list[RequestOutput]:
        expired = [
            r for r in self._with_deadline.values() if r.deadline is not None and now > r.deadline and r.request_id not in busy
        ]
        return [self._finish(r, "deadline") for r in expired]

    def drop_lost(self, seq_ids: set[int], rows: list[ScheduledRow]) -> list[ScheduledRow]:
        """Sequences `seq_ids` lost KV blocks (a corrupt NVMe block, dropped by the KV cache):
        their requests go back to recompute every token. The rows that still run."""
        lost = {
            r.request_id for r in self.requests.values() if r.seq_id in seq_ids and r.status in (Status.RUNNING, Status.SWAPPED)
        }
        for request_id in lost:
            req = self.requests[request_id]
            (self.running if req.status is Status.RUNNING else self.swapped).remove(req)
            self._requeue_for_recompute(req)
        return [r for r in rows if r.request_id not in lost]

    def fail(self, request_ids: list[str], error: str) -> list[RequestOutput]:
        """End requests with "error" (their step raised): the final outputs to send."""
        return [self._fail(self.requests[i], error) for i in request_ids if i in self.requests]

    # -- update ----------------------------------------------------------------------
    def update(self, rows: list[ScheduledRow], result: RunResult) -> list[RequestOutput]:
        """Account for a step that ran `rows`: new tokens, stops, and rows whose sampling failed."""
        outputs = []
        for row in rows:
            req = self.requests.get(row.request_id)
            if req is None or req.status is not Status.RUNNING or row.start != req.num_computed:
                continue  # ended while its row ran, or sent back to recompute (async scheduling: a lost block)
            wants_prompt_logits = req.wants_prompt_logits  # before this step's token is appended
            samples = result.verified.get(row.request_id) if row.draft_ids else None
            # A verification row computed its first token and the drafts it kept; the rest are rolled back.
            num_run = len(row.token_ids) if samples is None else len(samples)
            kept = [] if samples is None else [s.token_id for s in samples[:-1]]
            req.num_computed += num_run
            if req.num_computed <= len(req.prompt_ids):
                self.stats.num_computed_prompt_tokens += num_run
            if self.kv.fills_a_block(req.num_computed - num_run, req.num_computed):  # else commit changes nothing
                self.kv.commit(req.seq_id, req.token_ids + kept if kept else req.token_ids, req.num_computed)  # no copy a row
            if row.draft_ids:
                self.kv.truncate(req.seq_id, req.num_computed + 1)
            if wants_prompt_logits:
                req.prompt_logits.append(result.logits[row.request_id])
            if row.request_id in result.failed:
                outputs.append(self._fail(req, f"sampling failed:\n{result.failed[row.request_id]}"))
            elif samples is not None:
                outputs.append(self._append(req, samples))
            elif row.needs_sample:
                outputs.append(self._append(req, [result.sampled[row.request_id]]))
        return outputs

    def _append(self, req: Request, samples: list[Sample]) -> RequestOutput:
        """The request's new tokens, up to its end if it stops at one of them (the rest are dropped)."""
        taken = take_samples(req, samples, self.config, self.stats)
        if taken.refused_token is not None:  # a mask bug, never the model
            return self._fail(req, f"token {taken.refused_token} was sampled, but the request's grammar refuses it")
        if taken.stop_reason is not None:
            self._finish(req, taken.stop_reason)
        return taken.output(req)
