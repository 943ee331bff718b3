"""The plain data that crosses the arrows of one engine step.

out = scheduler.schedule()            SchedulerOutput: rows, moves, requests that ended
lost = kv.execute(out.moves)          ids of sequences whose KV was lost (corrupt blocks)
rows = scheduler.drop_lost(lost, out) the rows that still run
result = runner.execute(rows, ...)    RunResult: sampled tokens, failures, logits, attention
outputs = scheduler.update(rows, result)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from wicore.blocks.block_pool import Move
from wicore.blocks.tier import Tier
from wicore.structured.state import GrammarState
from wicore.types.images import ImageSpan
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import Sample, SamplingParams


@dataclass(frozen=True)
class ScheduledRow:
    """Run `token_ids` of one request, starting at position `start`, against `block_table`.

    Logits are wanted for the row's last `num_logits` tokens (0, 1, or every token of a
    prompt chunk whose request asked for prompt logits); the last of them is sampled from
    when `needs_sample` (the row ends at the request's last known token)."""

    request_id: str
    token_ids: list[int]
    start: int
    block_table: list[int]  # DEVICE frames of the request's blocks, in order (empty when offloaded)
    block_ids: list[int]  # the same blocks' ids (what per-block statistics refer to)
    window_table: list[int]  # DEVICE frames of its sliding-window blocks, from logical block window_first
    window_first: int
    num_logits: int
    needs_sample: bool
    params: SamplingParams
    images: tuple[ImageSpan, ...] = ()  # the images with soft tokens in this row (each one whole: in the
    # row, or partly cached before it)
    draft_ids: tuple[int, ...] = ()  # a verification row: its last len(draft_ids) tokens are a proposer's
    # draft, and every one of its tokens has logits (wicore.engine.speculative)
    prompt_ids: Sequence[int] = ()  # the request's prompt (the same list, not a copy) where its sampler
    # penalizes repetition: the prompt's tokens count as seen
    full_locations: tuple[tuple[Tier, int], ...] = ()  # an offloaded row (some full-attention blocks off the
    # device): (tier, frame) of each of them, in order; the runner stages them (wicore.kv.offload)
    grammar: GrammarState | None = None  # a constrained request's grammar (the request's own): the runner
    # reads its masks; only the scheduler advances it
    fed: bool = False  # async scheduling: a decode row whose one input is the token the step in flight
    # samples, fed to it on the worker (wicore.executor.prepared); token_ids holds a placeholder

    def advanced(self, token_ids: list[int], start: int, fed: bool = False) -> ScheduledRow:
        """This row with other tokens from another position, fed or not, the rest as it is (a steady
        decode step, wicore.engine.steady; a row planned ahead, Scheduler.plan_ahead). Its fields copied
        as they are: `dataclasses.replace` re-runs a frozen dataclass's __init__ (~7 us a row on the
        2-core VM, 0.7 this way; issue 37)."""
        row = object.__new__(ScheduledRow)
        row.__dict__.update(self.__dict__, token_ids=token_ids, start=start, fed=fed)
        return row


@dataclass(frozen=True)
class SchedulerOutput:
    rows: list[ScheduledRow]
    moves: list[Move]  # execute in order before running the rows
    finished: list[RequestOutput] = field(default_factory=list)  # ended while scheduling
    ended_request_ids: list[str] = field(default_factory=list)  # every request ended since the last step


@dataclass
class RunResult:
    """What the runner produced for one step's rows, by request id."""

    sampled: dict[str, Sample] = field(default_factory=dict)  # rows that ended at a token to sample
    verified: dict[str, list[Sample]] = field(default_factory=dict)  # verification rows: kept drafts + one token
    failed: dict[str, str] = field(default_factory=dict)  # rows whose sampling raised: the traceback
    logits: dict[str, np.ndarray] = field(default_factory=dict)  # rows with num_logits > 0: [num_logits, vocab]
    attention: dict[str, np.ndarray] = field(default_factory=dict)  # attention mass per block of the row (A2CR)
    graphs_seconds: float = 0.0  # inside ModelGraphs.run: binding, ONNX Runtime's runs, reading outputs back
