"""Continuous batching: which requests run how many tokens this step, and which blocks move.

Each step, in order:

    1. drop aborted and expired requests (their blocks return to the pool)
    2. running requests, best rank first: one decode token, or the next prefill chunk;
       when the pool cannot grow a request, the lowest-ranked running request is
       preempted (swapped to HOST/NVME, or freed for recompute when the tiers are full)
    3. swapped requests come back while DEVICE has room
    4. waiting requests are admitted by effective priority (priority + aging), FCFS within,
       reusing prefix-cached blocks, until max_num_seqs or the token budget runs out; one
       that shares full blocks of its prompt with a request still prefilling them waits for
       them (the prefix cache then holds them), so a document is computed once

Rank: higher priority first, then earlier arrival. A waiting request's priority rises one
level every `aging_seconds`, so a stream of urgent work cannot starve a low-priority one.
The scheduler never runs the model; the runner never sees queues. Admission checks (prompt,
context, KV capacity, queue length) are the engine's: what reaches `add` fits.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import Move
from wicore.blocks.tier import Tier
from wicore.engine.lookahead import can_plan_ahead
from wicore.engine.request import Request, Status
from wicore.engine.rows import FED_PLACEHOLDER, build_row, clip_draft, is_decode
from wicore.engine.scheduler_config import SchedulerConfig, SchedulerStats, StageBudget, StepBudget
from wicore.engine.scheduler_endings import SchedulerEndings
from wicore.engine.scheduler_steady import SteadyDecodes
from wicore.types.outputs import RequestOutput
from wicore.types.step import ScheduledRow, SchedulerOutput


class Scheduler(SchedulerEndings, SteadyDecodes):
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
        self._with_deadline: dict[str, Request] = {}  # what _drop_expired reads: not every request, every step
        self._ended: list[str] = []  # finished since the last schedule (the runner drops their state)
        self._seq_ids = itertools.count(1)
        self._planned: dict[str, ScheduledRow] = {}  # plan_ahead's rows, for the next schedule
        self._planned_moves: list[Move] = []  # what their appends moved (cached blocks evicted)
        self._held: set[str] = set()  # requests with a row in the step in flight (hold)
        self._deferred_frees: list[int] = []  # seq ids of held requests that ended: freed on release

    # -- requests --------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue an admitted request (Engine.add_request checked it)."""
        assert request.request_id not in self.requests, "admission checks request ids"
        request.seq_id = next(self._seq_ids)
        request.status = Status.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if request.deadline is not None:
            self._with_deadline[request.request_id] = request

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
    def decoding(self) -> list[Request]:
        """Running requests whose next row is a decode (one token to run): those that may speculate."""
        return [r for r in self.running if r.num_tokens - r.num_computed == 1]

    def plan_ahead(self, rows: Sequence[ScheduledRow], fed: Collection[str]) -> bool:
        """While the step that runs `rows` is in flight (async scheduling, wicore.engine.lookahead):
        the next decode row of each request whose token the step decides on the device (`fed`) and
        that `can_plan_ahead`, its blocks appended now and its input fed from the step's result. The
        next `schedule(busy=...)` runs them. Whether every request of the step that goes on after it
        got its row: else the next step waits for this one's result (a synchronous step)."""
        complete = True
        for row in rows:
            req = self.requests.get(row.request_id)
            if req is None or req.status is not Status.RUNNING:  # ended while its row ran (an abort, a failure)
                continue
            if row.needs_sample and not row.draft_ids and req.num_output_tokens + 1 >= req.max_tokens:
                continue  # the token in flight is its last
            start = req.num_tokens
            plan = None
            if row.request_id in fed and can_plan_ahead(req, row) and not self._crosses_rope_switch(req, start + 1):
                if is_decode(row) and self.kv.holds(req.seq_id, start, start + 1):
                    # its blocks as they are (kv.append would change nothing): the row in flight's tables
                    self._planned[req.request_id] = row.advanced([FED_PLACEHOLDER], start, fed=True)
                    continue
                plan = self.kv.append(req.seq_id, start, start + 1)
            if plan is None:  # host sampling, a prefill chunk, no room: the schedule after the step decides
                complete = False
                continue
            self._planned_moves += plan
            self._planned[req.request_id] = build_row(self.kv, req, 1, ahead=True)
        return complete

    def hold(self, request_ids: Collection[str]) -> None:
        """The step just launched runs rows of `request_ids`: one of them that ends before `release`
        keeps its blocks until then (the step in flight writes and reads them; async scheduling)."""
        self._held = set(request_ids)

    def release(self) -> None:
        """The held step returned: the blocks of the requests that ended while it ran go back."""
        for seq_id in self._deferred_frees:
            self.kv.free(seq_id)
        self._deferred_frees, self._held = [], set()

    @property
    def num_requests(self) -> int:
        """Requests not yet finished: waiting, running or swapped."""
        return len(self.requests)

    def drop_cancelled(self, busy: Collection[str] = ()) -> list[RequestOutput]:
        """End the aborted and expired requests now (their blocks return to the pool), but those in
        `busy`: the final outputs."""
        return self._drop_aborted(busy) + self._drop_expired(self.clock(), busy)

    def schedule(
        self,
        drafts: Mapping[str, Sequence[int]] | None = None,
        busy: Collection[str] = (),
        max_rows: int | None = None,
        ahead: bool = False,
    ) -> SchedulerOutput:
        """The step's rows and moves. `drafts` (request id -> draft tokens) turn decodes into
        verification rows (wicore.engine.speculative), as far as the step's tokens and the KV cache allow.
        `busy`: running requests in a step still in flight (wicore.engine.groups): not scheduled,
        preempted or ended (an abort or deadline waits for their step's return); their `plan_ahead`
        rows run. `ahead`: the step after the one in flight (async scheduling), whose requests have
        then computed their prompts. `max_rows`: the most rows the step takes."""
        now = self.clock()
        finished = self._drop_aborted(busy) + self._drop_expired(now, busy)
        moves, self._planned_moves = self._planned_moves, []
        planned, self._planned = self._planned, {}
        rows: list[ScheduledRow] = []
        cfg = self.config
        free = [r for r in self.running if r.request_id not in busy] if busy else self.running
        # fed rows of requests in flight (async scheduling): decodes, their blocks appended
        fed = [row for row in planned.values() if row.request_id in busy and self._is_running(row.request_id)]
        decoding = bool(fed) or any(r.num_tokens - r.num_computed == 1 for r in free)
        prefill = cfg.prefill_with_decodes if decoding else cfg.max_num_batched_tokens
        budget = StepBudget(cfg.max_num_batched_tokens, prefill, cfg.prefill_chunk, max_rows)
        stage = StageBudget(cfg.max_staged_blocks)
        budget.spend_fed(len(fed))
        rows += fed
        self.stats.num_planned_rows += len(fed)

        queue = deque(sorted(free, key=self._rank))
        preempted_this_step = False
        while queue and budget.tokens > 0:
            req = queue.popleft()
            n = budget.fits(req)
            if n == 0:  # a prefill chunk, and the step's prefill tokens are spent
                continue
            if self._crosses_rope_switch(req, req.num_computed + n):
                self._recompute_past_rope_switch(req)
                continue
            draft = clip_draft(cfg, req, n, (drafts or {}).get(req.request_id, ()), budget.tokens)
            plan = self.kv.append(req.seq_id, req.num_computed, req.num_computed + n + len(draft))
            if plan is None and draft:  # no room for the draft: a plain decode
                draft = ()
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
            moves += plan
            if not self._stage(stage, req):  # its blocks do not fit this step's staging: a later step
                continue
            budget.spend(req, n + len(draft))
            rows.append(build_row(self.kv, req, n, draft))

        if fed:  # in rank order, as the running requests' rows are without async scheduling
            order = {r.request_id: (self._rank(r), i) for i, r in enumerate(self.running)}
            rows.sort(key=lambda row: order[row.request_id])
        if not preempted_this_step:
            self._swap_in(rows, moves, budget, stage)
            if not self.swapped:
                self._admit(rows, moves, budget, stage, now, busy if ahead else ())
        ended, self._ended = self._ended, []
        return SchedulerOutput(rows, moves, finished, ended)

    def _is_running(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        return req is not None and req.status is Status.RUNNING

    def _rank(self, req: Request, now: float | None = None) -> tuple[int, float]:
        return req.rank(self.config.aging_seconds, now)

    def _stage(self, stage: StageBudget, req: Request) -> bool:
        """Whether `req`'s row fits what the step may stage (always, when nothing is offloaded); taken if so."""
        return stage.capacity is None or stage.take(self.kv.num_full_blocks(req.seq_id), self.kv.is_offloaded(req.seq_id))

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

    def _crosses_rope_switch(self, req: Request, stop: int) -> bool:
        """Whether running `req` up to `stop` tokens takes it past LongRoPE's switch while its
        cached keys have the short factors."""
        switch = self.config.long_rope_switch
        return bool(switch) and not req.whole_until and stop > switch

    def _recompute_past_rope_switch(self, req: Request) -> None:
        """`req` reaches past LongRoPE's switch: as transformers' generate drops its cache there and
        runs the whole sequence with the long factors, its blocks go and it is prefilled again, the
        first switch + 1 tokens in one chunk (`Request.whole_until`, set at its admission)."""
        self.running.remove(req)
        self._requeue(req)
        self.stats.num_long_rope_recomputes += 1

    def _swap_in(self, rows: list[ScheduledRow], moves: list[Move], budget: StepBudget, stage: StageBudget) -> None:
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
            moves += more
            if not self._stage(stage, req):
                continue
            budget.spend(req, n)
            rows.append(build_row(self.kv, req, n))

    def _admit(
        self,
        rows: list[ScheduledRow],
        moves: list[Move],
        budget: StepBudget,
        stage: StageBudget,
        now: float,
        prefilled: Collection[str],
    ) -> None:
        if len(self.running) >= self.config.max_num_seqs or budget.prefill_room == 0:
            return  # the batch is full: the waiting queue is not even ranked (a step's cost is its rows')
        for req in sorted(self.waiting, key=lambda r: self._rank(r, now)):
            if len(self.running) >= self.config.max_num_seqs or budget.prefill_room == 0:
                break
            if self._shares_a_prefill(req, prefilled):
                continue
            switch = self.config.long_rope_switch
            req.whole_until = switch + 1 if switch and req.num_tokens > switch else 0
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
            # else its next chunk is an image that does not fit this step, or its blocks the step's
            # staging: it runs a later step
            if n and self._stage(stage, req):
                budget.spend(req, n)
                rows.append(build_row(self.kv, req, n))

    def _shares_a_prefill(self, req: Request, prefilled: Collection[str] = ()) -> bool:
        """Whether `req` should wait for a running request that is still prefilling blocks of the
        prompt they share (many questions over one document sent together): admitted once those
        blocks are computed, it reuses them from the prefix cache instead of computing them again.
        `prefilled`: requests whose prompt will be computed by the step in flight."""
        if not self.kv.prefix_cache_enabled or req.params.prompt_logits or req.image_spans:
            return False
        block = self.kv.block_size
        return any(r.is_prefilling_a_block_of(req, block) for r in self.running if r.request_id not in prefilled)

    def _set_running(self, req: Request, source: list[Request]) -> None:
        source.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)
