"""BlockPool's random walk: random sequences of allocations, appends, frees, swaps and releases over a
tiny pool, against a model of what each block's KV holds (hypothesis' state machine)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pool_helpers import BS, TOKENS, D, FakeClock, N, Plan

from wicore.blocks.block_pool import Allocation, BlockInfo, BlockPool, Move
from wicore.blocks.policy import A2CRPolicy, LRUPolicy
from wicore.blocks.tier import Tier


def replay(before: list[BlockInfo], moves: list[Move], pool: BlockPool) -> None:
    """Execute a plan on the frames as they were: each move finds its block at src and an empty
    dst, only unreferenced blocks are dropped, and the blocks end where the pool says they are."""
    at = {(b.tier, b.frame): b.block_id for b in before}
    ref_count = {b.block_id: b.ref_count for b in before}
    for move in moves:
        assert at.pop(move.src) == move.block_id
        if move.dst is None:
            assert ref_count[move.block_id] == 0
        else:
            assert move.dst not in at
            at[move.dst] = move.block_id
    now_at = {b.block_id: (b.tier, b.frame) for b in pool.blocks()}
    for place, block_id in at.items():
        assert now_at[block_id] == place


class PoolMachine(RuleBasedStateMachine):
    """Random sequences over a tiny pool, against a model of what each block's KV holds."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.pool: BlockPool | None = None
        self.tokens: dict[int, list[int]] = {}  # sequence -> its tokens so far
        self.num_computed: dict[int, int] = {}
        self.swapped: set[int] = set()
        self.content: dict[int, tuple[int, ...]] = {}  # block -> all tokens up to its end, once written
        self.invalidated: set[int] = set()  # blocks dropped from the cache as corrupt
        self.prompts: list[tuple[int, ...]] = []  # tokens of the ended sequences, to share prefixes with
        self.next_seq_id = 0

    @initialize(
        device=st.integers(2, 10),
        host=st.integers(0, 4),
        nvme=st.integers(0, 4),
        cache=st.sampled_from([True, True, False]),
        lru=st.booleans(),
        warm=st.lists(TOKENS, max_size=6),
        offload=st.booleans(),
    )
    def build(self, device: int, host: int, nvme: int, cache: bool, lru: bool, warm: list[list[int]], offload: bool) -> None:
        """A pool, warmed by prompts that ran to the end (their full blocks cached); with `offload`,
        running sequences may keep blocks on HOST."""
        policy = LRUPolicy() if lru else A2CRPolicy()
        self.pool = BlockPool(device, host, nvme, BS, policy, cache, clock=self.clock, offload=offload)
        for prompt in warm:
            seq_id = self._add(prompt)
            if seq_id is not None:
                self._commit(seq_id, len(prompt))
                self._free(seq_id)

    # -- rules
    @rule(data=st.data(), suffix=TOKENS, prefill=st.booleans())
    def add(self, data: st.DataObject, suffix: list[int], prefill: bool) -> None:
        """A new prompt: some leading tokens of an ended sequence (maybe none), then `suffix`;
        with `prefill`, its first step runs at once (all its tokens computed)."""
        self._add_after(data, self.prompts, suffix, prefill)

    @rule(data=st.data(), suffix=TOKENS, prefill=st.booleans())
    def add_sibling(self, data: st.DataObject, suffix: list[int], prefill: bool) -> None:
        """The same, sharing leading tokens with a live sequence."""
        self._add_after(data, [tuple(t) for _, t in sorted(self.tokens.items())], suffix, prefill)

    @rule(data=st.data(), extra=st.lists(st.integers(0, 1), min_size=1, max_size=6))
    def append(self, data: st.DataObject, extra: list[int]) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        num_blocks = len(self.pool.block_ids(seq_id))
        if self._planned(lambda: self.pool.append(seq_id, len(self.tokens[seq_id]) + len(extra))) is not None:
            self._new_blocks(self.pool.block_ids(seq_id)[num_blocks:])
            self.tokens[seq_id] += extra

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        num_tokens = len(self.tokens[seq_id])
        self._commit(seq_id, data.draw(st.one_of(st.just(num_tokens), st.integers(self.num_computed[seq_id], num_tokens))))

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Computed leading blocks of a running sequence leave its sliding window."""
        seq_id = self._pick(data, self._running())
        if seq_id is None:
            return
        first = data.draw(st.integers(0, self.num_computed[seq_id] // BS))
        kept = self.pool.block_ids(seq_id)[max(0, first - self.pool.first_block(seq_id)) :]
        self.pool.release(seq_id, first)
        assert self.pool.block_ids(seq_id) == kept
        assert self.pool.first_block(seq_id) >= first

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A sequence ends with all its tokens computed."""
        seq_id = self._pick(data, self._running())
        if seq_id is not None:
            self._commit(seq_id, len(self.tokens[seq_id]))
            self._free(seq_id)

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """A sequence is aborted or preempted by recompute, running or swapped out."""
        seq_id = self._pick(data, sorted(self.tokens))
        if seq_id is not None:
            self._free(seq_id)

    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, self._running())
        if seq_id is None or self._planned(lambda: self.pool.swap_out(seq_id)) is None:
            return
        live = {b.block_id: b for b in self.pool.blocks()}
        for block_id in self.pool.block_ids(seq_id):  # only shared blocks stay on DEVICE
            assert live[block_id].tier is not D or live[block_id].ref_count > 1
            assert self.pool.offload or (live[block_id].tier is D) == (live[block_id].ref_count > 1)
        self.swapped.add(seq_id)

    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        seq_id = self._pick(data, sorted(self.swapped))
        if seq_id is None:
            return
        block_ids = self.pool.block_ids(seq_id)
        if self._planned(lambda: self.pool.swap_in(seq_id)) is not None:
            assert self.pool.block_ids(seq_id) == block_ids
            self.swapped.discard(seq_id)

    @rule(data=st.data())
    def invalidate(self, data: st.DataObject) -> None:
        """A block's bytes are found corrupt (its holders go on here: the checks still hold)."""
        blocks = self.pool.blocks()
        if not blocks:
            return
        block = data.draw(st.sampled_from(blocks))
        self.pool.invalidate(block.block_id)
        if block.is_cached:
            self.invalidated.add(block.block_id)
        live = {b.block_id: b for b in self.pool.blocks()}
        if block.ref_count:  # held: stays until its holders let go, but out of the cache
            assert not live[block.block_id].is_cached
        else:
            assert block.block_id not in live

    @rule(seconds=st.floats(0.0, 30.0), mass=st.floats(0.0, 4.0), data=st.data())
    def tick(self, seconds: float, mass: float, data: st.DataObject) -> None:
        """Time passes; a live block may receive attention."""
        self.clock.now += seconds
        blocks = self.pool.blocks()
        if blocks:
            self.pool.policy.add_attention(data.draw(st.sampled_from(blocks)).block_id, mass)

    # -- invariants
    @invariant()
    def consistent(self) -> None:
        if self.pool is None:
            return
        pool, blocks = self.pool, self.pool.blocks()
        places = [(b.tier, b.frame) for b in blocks]
        assert len(set(places)) == len(places)  # no frame holds two blocks
        assert (D, BlockPool.SINK_SLOT) not in places
        for tier in Tier:
            in_tier = [b for b in blocks if b.tier is tier]
            first = 1 if tier is D else 0
            assert all(first <= b.frame < first + pool.num_frames(tier) for b in in_tier)
            assert pool.usage(tier) == len(in_tier)
            assert pool.num_free(tier) + pool.usage(tier) == pool.num_frames(tier)
            assert pool.num_evictable(tier) == sum(b.ref_count == 0 for b in in_tier)
        holders = Counter(b for s in self.tokens for b in pool.block_ids(s))
        frames = {b.block_id: b.frame for b in blocks}
        for b in blocks:
            assert b.ref_count == holders[b.block_id]
            assert b.ref_count > 0 or b.is_cached  # an unreferenced block is either cached or gone
            assert pool.enable_prefix_cache or not b.is_cached
        assert set(holders) <= {b.block_id for b in blocks}
        for seq_id, tokens in self.tokens.items():
            block_ids = pool.block_ids(seq_id)
            assert len(set(block_ids)) == len(block_ids)
            assert pool.first_block(seq_id) + len(block_ids) == -(-len(tokens) // BS)
            assert pool.is_swapped(seq_id) == (seq_id in self.swapped)
            if seq_id not in self.swapped:
                places = dict(zip((b.block_id for b in blocks), ((b.tier, b.frame) for b in blocks)))
                assert pool.block_locations(seq_id) == [places[b] for b in block_ids]
                assert all(places[b][0] is not N for b in block_ids)  # a running sequence reads D or H only
                assert pool.is_offloaded(seq_id) == any(places[b][0] is not D for b in block_ids)
                assert pool.offload or not pool.is_offloaded(seq_id)
                if not pool.is_offloaded(seq_id):
                    assert pool.block_table(seq_id) == [frames[b] for b in block_ids]

    def teardown(self) -> None:
        if self.pool is None:
            return
        for seq_id in list(self.tokens):
            self._free(seq_id)
        blocks = self.pool.blocks()
        assert all(b.ref_count == 0 and b.is_cached for b in blocks)
        for tier in Tier:
            num_cached = sum(b.tier is tier for b in blocks)
            assert self.pool.usage(tier) == num_cached == self.pool.num_evictable(tier)
            assert self.pool.enable_prefix_cache or self.pool.usage(tier) == 0

    # -- the steps the rules share, each checked against the model
    def _add_after(self, data: st.DataObject, bases: list[tuple[int, ...]], suffix: list[int], prefill: bool) -> None:
        base = data.draw(st.sampled_from(bases)) if bases else ()
        num_shared = data.draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
        prompt = list(base[:num_shared]) + suffix
        seq_id = self._add(prompt)
        if prefill and seq_id is not None:
            self._commit(seq_id, len(prompt))

    def _add(self, prompt: list[int]) -> int | None:
        seq_id, self.next_seq_id = self.next_seq_id, self.next_seq_id + 1
        alloc = self._planned(lambda: self.pool.allocate(seq_id, prompt))
        if alloc is None:
            return None
        num_hits, rest = divmod(alloc.num_cached_tokens, BS)
        assert rest == 0 and alloc.num_cached_tokens <= len(prompt) - 1
        assert self.pool.enable_prefix_cache or num_hits == 0
        block_ids = self.pool.block_ids(seq_id)
        for i, block_id in enumerate(block_ids[:num_hits]):  # a hit holds exactly this prefix's KV
            assert self.content[block_id] == tuple(prompt[: (i + 1) * BS])
            assert block_id not in self.invalidated
        self._new_blocks(block_ids[num_hits:])
        self.tokens[seq_id] = list(prompt)
        self.num_computed[seq_id] = alloc.num_cached_tokens
        return seq_id

    def _commit(self, seq_id: int, num_computed: int) -> None:
        tokens = self.tokens[seq_id]
        self.pool.commit(seq_id, tokens, num_computed)
        self.num_computed[seq_id] = num_computed
        first = self.pool.first_block(seq_id)
        for i, block_id in enumerate(self.pool.block_ids(seq_id)[: max(0, num_computed // BS - first)], first):
            prefix = tuple(tokens[: (i + 1) * BS])
            assert self.content.setdefault(block_id, prefix) == prefix

    def _free(self, seq_id: int) -> None:
        self.pool.free(seq_id)
        self.prompts.append(tuple(self.tokens.pop(seq_id)))
        del self.num_computed[seq_id]
        self.swapped.discard(seq_id)

    def _running(self) -> list[int]:
        return sorted(s for s in self.tokens if s not in self.swapped)

    @staticmethod
    def _pick(data: st.DataObject, seq_ids: list[int]) -> int | None:
        """One of `seq_ids`, or None when there is none (the rule then does nothing)."""
        return data.draw(st.sampled_from(seq_ids)) if seq_ids else None

    def _new_blocks(self, block_ids: list[int]) -> None:
        """Fresh blocks (maybe recycled ids) hold nothing yet."""
        for block_id in block_ids:
            self.content.pop(block_id, None)
            self.invalidated.discard(block_id)

    def _planned(self, call: Callable[[], Plan | None]) -> Plan | None:
        """Run a pool call that plans moves: None must change nothing; a plan must replay cleanly."""
        before = self.pool.blocks(), {s: self.pool.block_ids(s) for s in self.tokens}
        plan = call()
        if plan is None:
            assert (self.pool.blocks(), {s: self.pool.block_ids(s) for s in self.tokens}) == before
        else:
            replay(before[0], plan.moves if isinstance(plan, Allocation) else plan, self.pool)
        return plan


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=200, deadline=None)
TestPoolMachine.pytestmark = [pytest.mark.slow]  # 14 s on the 2-core VM, loaded
