"""A steady decode step: what `schedule` gives when the running requests are the last step's, each one
token on.

Most steps of a long generation run the same requests as the step before, each one token further.
`schedule` then admits, ends, preempts and swaps nothing: its rows are the last step's, each advanced
by a position, and its only bookkeeping is each row's `kv.append` (a new block where the position
starts one, a sliding-window block released where it falls behind the window; nothing for most rows).
`repeat_decodes` checks that this holds and gives that output without ranking, budgets or rows built
anew (issue 37: a tiny model's step spent ~50-70 us scheduling):

    every row: the request's next position in its last block    the row advanced (its tables as they are)
    a row whose position starts a block or leaves a window block  kv.append, as `schedule` calls it, in the
                                                                 rows' order; the row built anew
    anything else                                                 None: `schedule` decides

"Anything else": the running requests are not the last step's (one arrived with room for it, ended,
was preempted or swapped), an abort, an expired deadline, a step in flight (async scheduling),
LongRoPE's switch, KV staging. Where an append finds no room, the moves of the appends before it
are kept for `schedule` (it appends again: nothing more for those rows) and None is returned.

A mixin of Scheduler: it reads the scheduler's queues and the block groups, declared below.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import Move
from wicore.engine.request import Request
from wicore.engine.rows import build_row
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.types.step import ScheduledRow, SchedulerOutput


class SteadyDecodes:
    config: SchedulerConfig
    kv: BlockGroups
    clock: Callable[[], float]
    requests: dict[str, Request]
    waiting: list[Request]
    running: list[Request]
    swapped: list[Request]
    _aborted: deque[str]
    _with_deadline: dict[str, Request]
    _ended: list[str]
    _planned: dict[str, ScheduledRow]
    _planned_moves: list[Move]
    _held: set[str]

    def repeat_decodes(self, rows: Sequence[ScheduledRow], running: Sequence[Request]) -> SchedulerOutput | None:
        """The output `schedule` would give now, where its rows are `rows` (the last step's decode rows)
        each one token on: those rows and their appends' moves (the module docstring). `running`: the
        running requests as that step left them (`self.running` then, in order: their ranks gave the
        rows' order). None where `schedule` must decide."""
        requests = self._steady_requests(rows, running)
        if requests is None:
            return None
        block_size = self.kv.block_size
        window = self.kv.window
        moves: list[Move] = []
        advanced = []
        for row, req in zip(rows, requests):
            start = row.start + 1
            released = window is not None and window.first_needed(start) > row.window_first
            if start % block_size and not released:
                advanced.append(row.advanced(req.token_ids[start:], start))
                continue
            plan = self.kv.append(req.seq_id, start, start + 1)  # as `schedule` appends, in the rows' order
            if plan is None:  # no room: `schedule` preempts; the moves so far are its too
                self._planned_moves += moves
                return None
            moves += plan
            advanced.append(build_row(self.kv, req, 1))
        if moves:  # blocks were evicted: every row's tables as the books now hold them
            advanced = [build_row(self.kv, req, 1) for req in requests]
        return SchedulerOutput(advanced, moves)

    def in_rank_order(self, rows: Sequence[ScheduledRow]) -> bool:
        """Whether `rows` are in the order `schedule` gives running requests' rows: by rank. A step's
        admitted and swapped-in rows come after the running ones whatever their rank, and the next
        step scheduled in full sorts them in, where a repeat would keep the old order."""
        ranks = [self.requests[row.request_id].rank(self.config.aging_seconds) for row in rows]
        return ranks == sorted(ranks)

    def _steady_requests(self, rows: Sequence[ScheduledRow], running: Sequence[Request]) -> list[Request] | None:
        """The requests of `rows`, where each of them decodes its next token and nothing else changed
        since the step that ran them (the module docstring); else None."""
        cfg = self.config
        if self._aborted or self._planned or self._planned_moves or self._held or self._ended:
            return None
        if cfg.long_rope_switch or cfg.max_staged_blocks is not None:
            return None
        if (
            len(rows) != len(running)
            or len(self.running) != len(running)
            or any(a is not b for a, b in zip(self.running, running))
        ):
            return None
        if (self.waiting or self.swapped) and len(self.running) < cfg.max_num_seqs:
            return None  # one could be admitted or swapped in
        if self._with_deadline:
            now = self.clock()
            if any(r.deadline is not None and now > r.deadline for r in self._with_deadline.values()):
                return None
        requests = []
        for row in rows:
            req = self.requests.get(row.request_id)
            if req is None or req.num_computed != row.start + 1 or req.num_tokens != row.start + 2:
                return None
            requests.append(req)
        return requests
