"""The scheduler's fast paths change nothing: random workloads run with them and without them give the
same steps, field for field, and the same KV books after every step (blocks, tables, prefix cache).

    BlockGroups.holds       `append` answers at once; `plan_ahead` advances the row in flight one position
    fills_a_block           `update` commits a row's tokens only where they fill a block

"Without" is each fast path forced off (holds False: every append and planned row goes the full way;
fills_a_block True: every row commits). The workloads mix what these paths must keep exact: a sliding
window smaller than a few blocks, a tight DEVICE pool (preemption by swap and by recompute), shared
prefixes, aborts, deadlines, stop tokens, failed samples, lost blocks, host-sampled and penalized rows,
prompt logits, speculative rows (synchronous steps) and steps scheduled while the one before is in
flight (async scheduling, driven as EngineCore._step_async drives it).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import LRUPolicy
from wicore.engine.request import Request
from wicore.engine.scheduler import Scheduler, SchedulerConfig
from wicore.types.outputs import Priority
from wicore.types.sampling import Sample, SamplingParams
from wicore.types.step import RunResult, ScheduledRow


class Workload:
    """One random workload through a scheduler; `trace` holds every step's rows, moves, outputs and books."""

    def __init__(self, seed: int, mode: str) -> None:
        self.rng = rng = random.Random(seed)
        self.mode = mode
        self.bs = bs = rng.choice([2, 4, 8])
        window = rng.choice([None, 2 * bs, bs + 1])
        device, host = rng.choice([8, 12, 24]), rng.choice([0, 8])
        cache = rng.random() < 0.85
        pools = [BlockPool(device, host, 0, bs, LRUPolicy(), cache, lambda: self.now, group=g) for g in (0, 1)]
        self.kv = BlockGroups(pools[0], pools[1], window) if window else BlockGroups(pools[0])
        self.now = 0.0
        config = SchedulerConfig(
            max_num_seqs=rng.choice([2, 4, 8]),
            max_num_batched_tokens=rng.choice([16, 32]),
            prefill_with_decodes=rng.choice([4, 8]),
            prefill_chunk=rng.choice([3, 5, 16]),
            preemption=rng.choice(["swap", "recompute"]),
            eos_token_ids=(3,),
        )
        self.sched = Scheduler(config, self.kv, clock=lambda: self.now)
        self.prefixes = [[rng.randrange(10, 20) for _ in range(rng.randrange(1, 3 * bs))] for _ in range(3)]
        self.host_sampled: set[str] = set()
        self.num_added = 0
        self.trace: list[str] = []

    # -- what happens between steps ---------------------------------------------------------------
    def arrive_and_abort(self) -> None:
        rng, self.now = self.rng, self.now + 0.5
        if rng.random() < 0.35 and self.num_added < 30:
            self.num_added += 1
            request_id = f"q{self.num_added}"
            prompt = rng.choice(self.prefixes) + [rng.randrange(10, 20) for _ in range(rng.randrange(0, 3 * self.bs))]
            kind = rng.random()
            params = SamplingParams(
                max_tokens=rng.randrange(1, 4 * self.bs),
                ignore_eos=rng.random() < 0.5,
                presence_penalty=0.5 if kind < 0.1 else 0.0,
                prompt_logits=0.1 <= kind < 0.15,
            )
            if rng.random() < 0.2:
                self.host_sampled.add(request_id)
            deadline = self.now + rng.randrange(1, 30) if rng.random() < 0.1 else None
            request = Request(request_id, prompt, params, params.max_tokens, rng.choice(list(Priority)), self.now, deadline)
            self.sched.add(request)
        if self.sched.requests and rng.random() < 0.08:
            self.sched.abort(rng.choice(sorted(self.sched.requests)))

    def lose_a_block(self, rows: list[ScheduledRow]) -> list[ScheduledRow]:
        """Now and then a running sequence's block is found corrupt (KVCache.execute's path)."""
        pool = self.kv.full.pool
        held = [r for r in self.sched.running if pool.block_ids(r.seq_id)]
        if not held or self.rng.random() > 0.04:
            return rows
        block = self.rng.choice(pool.block_ids(self.rng.choice(held).seq_id))
        lost = self.kv.holders({(0, block)})
        self.kv.invalidate(0, block)
        return self.sched.drop_lost(lost, rows)

    def result(self, rows: list[ScheduledRow]) -> RunResult:
        result = RunResult()
        for row in rows:
            if row.num_logits:
                result.logits[row.request_id] = np.zeros((row.num_logits, 2), np.float32)
            if row.draft_ids:
                kept = list(row.draft_ids[: self.rng.randrange(0, len(row.draft_ids) + 1)])
                result.verified[row.request_id] = [Sample(t) for t in [*kept, self.rng.randrange(10)]]
            elif row.needs_sample:
                if self.rng.random() < 0.02:
                    result.failed[row.request_id] = "sampling raised"
                result.sampled[row.request_id] = Sample(self.rng.randrange(10))
        return result

    # -- the record -------------------------------------------------------------------------------
    def record(self, kind: str, **fields: object) -> None:
        self.trace.append(json.dumps({"kind": kind, **fields}, sort_keys=True, default=repr))

    def record_books(self) -> None:
        books = []
        for g in self.kv.groups:
            pool = g.pool
            seqs = sorted(pool.seq_ids())
            books.append(
                [
                    [repr(b) for b in pool.blocks()],
                    sorted((h.hex(), b) for h, b in pool._cache.items()),
                    [(s, pool.block_ids(s), pool.first_block(s), pool.is_swapped(s)) for s in seqs],
                ]
            )
        self.record("books", books=books)

    def record_out(self, out) -> None:
        rows = [{**row.__dict__, "params": repr(row.params), "prompt_ids": list(row.prompt_ids)} for row in out.rows]
        self.record("schedule", rows=rows, moves=[repr(m) for m in out.moves], finished=[repr(o) for o in out.finished])

    # -- the loops --------------------------------------------------------------------------------
    def run(self) -> list[str]:
        (self.run_async if self.mode == "async" else self.run_sync)()
        return self.trace

    def run_sync(self) -> None:
        for _ in range(300):
            if not self.sched.has_work and self.num_added >= 30:
                return
            self.arrive_and_abort()
            drafts = {}
            if self.mode == "spec":
                for r in self.sched.decoding():
                    if self.rng.random() < 0.6:
                        drafts[r.request_id] = [self.rng.randrange(10) for _ in range(self.rng.randrange(1, 4))]
            out = self.sched.schedule(drafts)
            self.record_out(out)
            rows = self.lose_a_block(out.rows)
            self.record("update", outputs=[repr(o) for o in self.sched.update(rows, self.result(rows))])
            self.record_books()

    def run_async(self) -> None:
        sched, inflight = self.sched, None
        for _ in range(300):
            if not sched.has_work and self.num_added >= 30 and inflight is None:
                return
            self.arrive_and_abort()
            ahead, launched = False, None
            if inflight is not None:
                fed = {r.request_id for r in inflight if r.needs_sample and r.request_id not in self.host_sampled}
                ahead = sched.plan_ahead(inflight, fed)
                self.record("planned", ahead=ahead, rows=sorted(sched._planned))
            if inflight is None or ahead:
                out = sched.schedule(busy={r.request_id for r in inflight or ()}, ahead=True)
                self.record_out(out)
                launched = out.rows or None
                if inflight is None:
                    sched.hold({r.request_id for r in launched or ()})
                    inflight = launched
                    continue
            sched.release()
            sched.hold({r.request_id for r in launched or ()})
            outputs = sched.drop_cancelled()
            rows = self.lose_a_block(inflight)
            outputs += sched.update(rows, self.result(rows))
            self.record("update", outputs=[repr(o) for o in outputs])
            self.record_books()
            if not ahead:
                out = sched.schedule()
                self.record_out(out)
                launched = out.rows or None
                sched.hold({r.request_id for r in launched or ()})
            inflight = launched


@pytest.mark.parametrize("mode", ["sync", "async", "spec"])
@pytest.mark.parametrize("seed", range(6))
def test_the_fast_paths_give_the_steps_and_books_of_the_full_ones(monkeypatch, seed, mode):
    fast = Workload(seed, mode).run()
    monkeypatch.setattr(BlockGroups, "holds", lambda self, seq_id, start, num_tokens_total: False)
    monkeypatch.setattr(BlockGroups, "fills_a_block", lambda self, before, after: True)
    full = Workload(seed, mode).run()
    assert len(fast) == len(full) > 50
    for i, (a, b) in enumerate(zip(fast, full)):
        assert a == b, f"line {i} differs"
