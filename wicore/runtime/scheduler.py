"""Continuous batching: which requests run how many tokens this step, and which blocks move.

Each step, in order:

    1. drop aborted and expired requests (their blocks return to the pool)
    2. running requests, best rank first: one decode token, or the next prefill chunk;
       when the pool cannot grow a request, the lowest-ranked running request is
       preempted (swapped to HOST/NVME, or freed for recompute when the tiers are full)
    3. swapped requests come back while DEVICE has room
    4. waiting requests are admitted by effective priority (priority + aging), FCFS within,
       reusing prefix-cached blocks, until max_num_seqs or the token budget runs out

Rank: higher priority first, then earlier arrival. A waiting request's priority rises one
level every `aging_seconds`, so a stream of urgent work cannot starve a low-priority one.
The scheduler never runs the model; the runner never sees queues. Admission checks (prompt,
context, KV capacity, queue length) are the engine's: what reaches `add` fits.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wicore.hmt.block_groups import BlockGroups
from wicore.hmt.block_pool import Move
from wicore.hmt.tiers import Tier
from wicore.runtime.request import Priority, Request, RequestOutput, Status
from wicore.runtime.sampler import Sample
from wicore.runtime.step import RunResult, ScheduledRow, SchedulerOutput


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    # Tokens one step runs: up to max_num_batched_tokens (2048, the default batch of vLLM and
    # llama.cpp) while nothing is decoding, so a burst of prompts on an idle engine is prefilled
    # in one batched step; at most prefill_with_decodes of them prefill tokens while requests
    # are decoding, so those wait no longer than a 512-token prefill between two tokens; one
    # request prefills at most prefill_chunk a step (docs/PERFORMANCE.md measures the choices).
    max_num_batched_tokens: int = 2048
    prefill_with_decodes: int = 512
    prefill_chunk: int = 256
    max_waiting: int = 1024
    aging_seconds: float = 10.0
    preemption: str = "swap"  # or "recompute"
    max_context: int | None = None  # tokens per sequence; None: the model's (the engine sets it)
    eos_token_ids: tuple[int, ...] = ()  # the engine sets the model's

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.prefill_with_decodes, self.prefill_chunk) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens, prefill_with_decodes and prefill_chunk must be positive")
        if self.preemption not in ("swap", "recompute"):
            raise ValueError(f"preemption {self.preemption!r}: choose swap or recompute")

    def at_least(self, tokens: int) -> SchedulerConfig:
        """This config with room for a chunk of `tokens` in every step (an image's, run whole)."""
        return dataclasses.replace(
            self,
            max_num_batched_tokens=max(self.max_num_batched_tokens, tokens),
            prefill_with_decodes=max(self.prefill_with_decodes, tokens),
            prefill_chunk=max(self.prefill_chunk, tokens),
        )


@dataclass
class StepBudget:
    """What is left of one step: tokens in all, and tokens prefill chunks may still take."""

    tokens: int
    prefill: int
    chunk: int  # the most one request prefills

    @property
    def prefill_room(self) -> int:
        """The longest prefill chunk that still fits this step."""
        return max(0, min(self.tokens, self.prefill, self.chunk))

    def fits(self, req: Request) -> int:
        """Tokens `req` would run this step (0: none fit). One token left to run is a decode;
        more are a prefill chunk (a prompt, or tokens to recompute), which never cuts an image."""
        left = req.num_tokens - req.num_computed
        return min(left, self.tokens) if left == 1 else req.chunk(min(left, self.prefill_room))

    def spend(self, req: Request, n: int) -> None:
        """`req` runs `n` tokens (call before its num_computed moves)."""
        self.tokens -= n
        if req.num_tokens - req.num_computed > 1:
            self.prefill -= n


@dataclass
class SchedulerStats:
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests
    num_cached_tokens: int = 0  # of those, found in the prefix cache
    num_computed_prompt_tokens: int = 0  # prompt tokens actually run through the graphs
    num_generated_tokens: int = 0
    num_preempted_swap: int = 0
    num_preempted_recompute: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: BlockGroups, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.kv = kv
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.stats = SchedulerStats()
        self._aborted: deque[str] = deque()
        self._ended: list[str] = []  # finished since the last schedule (the runner drops their state)
        self._seq_ids = itertools.count(1)

    # -- requests --------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue an admitted request (Engine.add_request checked it)."""
        assert request.request_id not in self.requests, "admission checks request ids"
        request.seq_id = next(self._seq_ids)
        request.status = Status.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> None:
        """Cancel a request at any point; it ends at the next step with reason "abort"."""
        if request_id in self.requests:
            self._aborted.append(request_id)

    def has_request(self, request_id: str) -> bool:
        return request_id in self.requests

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self._aborted)

    # -- schedule --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        finished = self._drop_aborted() + self._drop_expired(now)
        moves: list[Move] = []
        rows: list[ScheduledRow] = []
        cfg = self.config
        decoding = any(r.num_tokens - r.num_computed == 1 for r in self.running)
        prefill = cfg.prefill_with_decodes if decoding else cfg.max_num_batched_tokens
        budget = StepBudget(cfg.max_num_batched_tokens, prefill, cfg.prefill_chunk)

        queue = sorted(self.running, key=self._rank)
        preempted_this_step = False
        while queue and budget.tokens > 0:
            req = queue.pop(0)
            n = budget.fits(req)
            if n == 0:  # a prefill chunk, and the step's prefill tokens are spent
                continue
            plan = self.kv.append(req.seq_id, req.num_computed, req.num_computed + n)
            while plan is None:
                preempted_this_step = True
                if queue:  # the lowest-ranked running request makes room
                    moves += self._preempt(queue.pop())
                elif rows:  # better-ranked requests run this step: this one waits its turn
                    moves += self._preempt(req)
                    break
                elif not self._unpin(req):  # alone, and not even all of DEVICE holds it
                    finished.append(self._fail(req, "needs more KV blocks than the device tier holds"))
                    break
                plan = self.kv.append(req.seq_id, req.num_computed, req.num_computed + n)
            if plan is None:
                continue
            budget.spend(req, n)
            moves += plan
            rows.append(self._row(req, n))

        if not preempted_this_step:
            self._swap_in(rows, moves, budget)
            if not self.swapped:
                self._admit(rows, moves, budget, now)
        ended, self._ended = self._ended, []
        return SchedulerOutput(rows, moves, finished, ended)

    def _rank(self, req: Request, now: float | None = None) -> tuple[int, float]:
        priority = int(req.priority)
        if now is not None and self.config.aging_seconds > 0:
            priority = min(int(Priority.URGENT), priority + int((now - req.arrival) / self.config.aging_seconds))
        return (-priority, req.arrival)

    def _row(self, req: Request, n: int) -> ScheduledRow:
        start = req.num_computed
        window_table, window_first = self.kv.window_table(req.seq_id)
        needs_sample = start + n == req.num_tokens
        return ScheduledRow(
            request_id=req.request_id,
            token_ids=req.token_ids[start : start + n],
            start=start,
            block_table=self.kv.block_table(req.seq_id),
            block_ids=self.kv.block_ids(req.seq_id),
            window_table=window_table,
            window_first=window_first,
            num_logits=n if req.wants_prompt_logits else int(needs_sample),
            needs_sample=needs_sample,
            params=req.params,
            images=req.images_in(start, start + n),
        )

    def _preempt(self, req: Request) -> list[Move]:
        self.running.remove(req)
        if self.config.preemption == "swap":
            plan = self.kv.swap_out(req.seq_id)
            if plan is not None:
                req.status = Status.SWAPPED
                self.swapped.append(req)
                self.stats.num_preempted_swap += 1
                return plan
        self._requeue_for_recompute(req)
        return []

    def _unpin(self, req: Request) -> bool:
        """`req` is all that could run but DEVICE cannot hold it: the only other blocks there are
        cached ones (already evicted by the pool when it could) and those that swapped requests
        share (prefixes they had in common with requests that have since left, which swap-out
        leaves on DEVICE). Without this, `req` would be swapped out and in again forever. The
        lowest-ranked swapped request that holds DEVICE blocks is sent back to recompute (its
        references go, its blocks stay cached); False when there is none."""
        pinning = [r for r in self.swapped if r is not req and self.kv.num_blocks_in(r.seq_id, Tier.DEVICE)]
        if not pinning:
            return False
        victim = max(pinning, key=self._rank)
        self.swapped.remove(victim)
        self._requeue_for_recompute(victim)
        return True

    def _fail(self, req: Request, reason: str) -> RequestOutput:
        return dataclasses.replace(self._finish(req, "error"), error=f"request {req.request_id}: {reason}")

    def _requeue_for_recompute(self, req: Request) -> None:
        """Free the request's blocks; it re-enters the waiting queue and recomputes its tokens."""
        self.kv.free(req.seq_id)
        req.num_computed = 0
        req.prompt_logits = []
        req.status = Status.WAITING
        self.waiting.append(req)
        self.stats.num_preempted_recompute += 1

    def _swap_in(self, rows: list[ScheduledRow], moves: list[Move], budget: StepBudget) -> None:
        for req in sorted(self.swapped, key=self._rank):
            if len(self.running) >= self.config.max_num_seqs or budget.tokens <= 0:
                break
            n = budget.fits(req)
            if n == 0:  # its next tokens are a prefill chunk, and none fit this step
                break
            plan = self.kv.swap_in(req.seq_id)
            while plan is None and not self.running and self._unpin(req):
                plan = self.kv.swap_in(req.seq_id)
            if plan is None:
                break
            moves += plan
            self._set_running(req, self.swapped)
            more = self.kv.append(req.seq_id, req.num_computed, req.num_computed + n)
            if more is None:  # back in, but no room to grow this step: it runs next step
                continue
            budget.spend(req, n)
            moves += more
            rows.append(self._row(req, n))

    def _admit(self, rows: list[ScheduledRow], moves: list[Move], budget: StepBudget, now: float) -> None:
        for req in sorted(self.waiting, key=lambda r: self._rank(r, now)):
            if len(self.running) >= self.config.max_num_seqs or budget.prefill_room == 0:
                break
            alloc = self.kv.allocate(
                req.seq_id,
                req.token_ids,
                budget.prefill_room,
                reuse_prefix=not req.params.prompt_logits,
                extra_keys=req.extra_keys(self.kv.block_size),
            )
            if alloc is None:
                break  # the best-ranked request waits for room; nothing jumps ahead of it
            if not req.was_admitted:  # readmissions after preemption are not prefix-cache traffic
                req.was_admitted = True
                self.stats.num_prompt_tokens += len(req.prompt_ids)
                self.stats.num_cached_tokens += alloc.num_cached_tokens
                req.num_cached_prompt_tokens = alloc.num_cached_tokens
            req.num_computed = alloc.num_cached_tokens
            moves += alloc.moves
            self._set_running(req, self.waiting)
            n = budget.fits(req)
            if n:  # else its next chunk is an image that does not fit this step: it runs next step
                budget.spend(req, n)
                rows.append(self._row(req, n))

    def _set_running(self, req: Request, source: list[Request]) -> None:
        source.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)

    # -- endings ---------------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> RequestOutput:
        if req.status is not Status.FINISHED:
            for queue in (self.waiting, self.running, self.swapped):
                if req in queue:
                    queue.remove(req)
            if req.status is not Status.WAITING:
                self.kv.free(req.seq_id)
            req.status = Status.FINISHED
            self._ended.append(req.request_id)
        self.requests.pop(req.request_id, None)
        return RequestOutput(req.request_id, [], True, reason, len(req.prompt_ids), req.num_cached_prompt_tokens)

    def _drop_aborted(self) -> list[RequestOutput]:
        out = []
        while self._aborted:
            req = self.requests.get(self._aborted.popleft())
            if req is not None:
                out.append(self._finish(req, "abort"))
        return out

    def _drop_expired(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self.requests.values() if r.deadline is not None and now > r.deadline]
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
            if req is None or req.status is not Status.RUNNING:
                continue
            wants_prompt_logits = req.wants_prompt_logits  # before this step's token is appended
            req.num_computed += len(row.token_ids)
            if req.num_computed <= len(req.prompt_ids):
                self.stats.num_computed_prompt_tokens += len(row.token_ids)
            self.kv.commit(req.seq_id, req.token_ids, req.num_computed)
            if wants_prompt_logits:
                req.prompt_logits.append(result.logits[row.request_id])
            if row.request_id in result.failed:
                outputs.append(self._fail(req, f"sampling failed:\n{result.failed[row.request_id]}"))
            elif row.needs_sample:
                outputs.append(self._append(req, result.sampled[row.request_id]))
        return outputs

    def _append(self, req: Request, sample: Sample) -> RequestOutput:
        """The request's new token, and its end if it stops there."""
        token = sample.token_id
        req.token_ids.append(token)
        self.stats.num_generated_tokens += 1
        prompt_logits = None
        if req.prompt_logits and len(req.output_ids) == 1:  # the first output carries them
            prompt_logits, req.prompt_logits = np.concatenate(req.prompt_logits), []
        reason = self._stop_reason(req, token)
        if reason is not None:
            self._finish(req, reason)
        return RequestOutput(
            req.request_id,
            [token],
            reason is not None,
            reason,
            len(req.prompt_ids),
            req.num_cached_prompt_tokens,
            logprobs=None if sample.logprobs is None else [sample.logprobs],
            prompt_logits=prompt_logits,
        )

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.config.eos_token_ids):
            return "stop"
        context = self.config.max_context
        if len(req.output_ids) >= req.max_tokens or (context is not None and req.num_tokens >= context):
            return "length"
        return None
