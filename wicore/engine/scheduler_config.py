"""The scheduler's settings, what is left of one step's token budget, and its counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from wicore.engine.request import Request


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
    # Full-attention blocks a step with an offloaded row may stage (wicore.kv.offload); None:
    # nothing is offloaded (the engine sets it from EngineConfig.kv_offload_tokens).
    max_staged_blocks: int | None = None
    # LongRoPE models (Phi-3-128k, Phi-3.5): original_max_position_embeddings, where transformers
    # switches to the long factors (0: none; the engine sets it). A sequence that grows past it
    # recomputes its KV in one chunk with the long factors, as transformers' generate does.
    long_rope_switch: int = 0

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

    def with_long_rope(self, switch: int) -> SchedulerConfig:
        """This config for a LongRoPE model switching at `switch` tokens: a chunk of `switch + 1`
        fits every step, beside a decode row of every other sequence (else a sequence past the
        switch would wait while the others decode)."""
        roomy = self.at_least(switch + 1)
        tokens = max(roomy.max_num_batched_tokens, switch + 1 + self.max_num_seqs)
        return dataclasses.replace(roomy, max_num_batched_tokens=tokens, long_rope_switch=switch)


@dataclass
class StepBudget:
    """What is left of one step: tokens in all, tokens prefill chunks may still take, and rows."""

    tokens: int
    prefill: int
    chunk: int  # the most one request prefills
    rows: int | None = None  # rows the step may still take; None: no limit but the tokens

    @property
    def prefill_room(self) -> int:
        """The longest prefill chunk that still fits this step."""
        if self.rows is not None and self.rows <= 0:
            return 0
        return max(0, min(self.tokens, self.prefill, self.chunk))

    def fits(self, req: Request) -> int:
        """Tokens `req` would run this step (0: none fit). One token left to run is a decode;
        more are a prefill chunk (a prompt, or tokens to recompute), which never cuts an image."""
        if self.rows is not None and self.rows <= 0:
            return 0
        left = req.num_tokens - req.num_computed
        return min(left, self.tokens) if left == 1 else req.chunk(min(left, self.prefill_room))

    def spend(self, req: Request, n: int) -> None:
        """`req` runs `n` tokens (call before its num_computed moves)."""
        self._take(n, is_prefill=req.num_tokens - req.num_computed > 1)

    def spend_fed(self, num_rows: int) -> None:
        """`num_rows` fed decode rows (async scheduling): one token each, none of the prefill's. Not
        `spend`: their requests' num_computed does not count the step in flight yet, so a prompt that
        step computes would look like one still to run, and its decode would take a prefill token from
        the chunks beside it (a step cut otherwise than without the flag)."""
        self.tokens -= num_rows
        if self.rows is not None:
            self.rows -= num_rows

    def _take(self, n: int, is_prefill: bool) -> None:
        self.tokens -= n
        if self.rows is not None:
            self.rows -= 1
        if is_prefill:
            self.prefill -= n


@dataclass
class StageBudget:
    """What a step may still stage. When any row of a step is offloaded, the runner stages every row's
    full-attention blocks (the graph reads one buffer per layer), so their sum must fit."""

    capacity: int | None  # SchedulerConfig.max_staged_blocks
    num_blocks: int = 0  # the full-attention blocks of the step's rows so far
    offloaded: bool = False  # whether one of them is offloaded

    def take(self, num_blocks: int, offloaded: bool) -> bool:
        """Whether a row with `num_blocks` full blocks (offloaded or not) still fits the step; taken if so."""
        if self.capacity is not None and (self.offloaded or offloaded) and self.num_blocks + num_blocks > self.capacity:
            return False
        self.num_blocks += num_blocks
        self.offloaded = self.offloaded or offloaded
        return True


@dataclass
class SchedulerStats:
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests
    num_cached_tokens: int = 0  # of those, found in the prefix cache
    num_computed_prompt_tokens: int = 0  # prompt tokens actually run through the graphs
    num_generated_tokens: int = 0
    num_preempted_swap: int = 0
    num_preempted_recompute: int = 0
    num_long_rope_recomputes: int = 0  # sequences prefilled again past LongRoPE's switch
    num_planned_rows: int = 0  # decode rows planned while the step before ran, and run (async scheduling)

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
