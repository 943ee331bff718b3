"""Whether a request can run to its end, decided before it is queued.

`Limits` holds only what the engine core fixed at construction (the context, the KV layout and
tiers, where images go in a prompt), so `check` is safe on any thread: the `Engine` calls it on the
caller's thread and answers a request that can never fit at once, with what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wicore.engine.scheduler_config import SchedulerConfig
from wicore.errors import ContextLengthError, RequestError
from wicore.executor.vision import NO_VISION
from wicore.kv.layout import KVLayout, context_advice
from wicore.types.images import ImageInput, ImagePlacement, ImageSpan
from wicore.types.sampling import SamplingParams


@dataclass(frozen=True)
class Admission:
    """What `check` found for a request that fits: the tokens it may generate (max_tokens capped
    by the room left) and where its images go in the prompt."""

    max_tokens: int
    image_spans: tuple[ImageSpan, ...] = ()


@dataclass(frozen=True)
class Limits:
    """What one sequence may hold: `max_sequence_tokens` (prompt and output) within `max_context`
    (the model's, or the configured one), `window_blocks` in the sliding layers' cache."""

    vocab_size: int
    model_context: int
    max_context: int
    max_sequence_tokens: int
    layout: KVLayout
    window_blocks: int
    scheduler: SchedulerConfig
    kv_offload_tokens: int
    vision: ImagePlacement | None  # where images go; None for a model without a vision partition

    def check(self, ids: list[int], params: SamplingParams, images: Sequence[ImageInput] = ()) -> Admission:
        """Raises RequestError (ContextLengthError for a prompt with no room left) unless the
        request can run to its end."""
        if not ids:
            raise RequestError("the prompt is empty")
        if images and self.vision is None:
            raise RequestError(NO_VISION)
        spans = () if self.vision is None else self.vision.spans(ids, images)
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise RequestError(f"token ids must be in [0, {self.vocab_size})")
        limit = self.max_sequence_tokens
        if len(ids) >= limit:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; {self._context_limit(len(ids) + 1)}")
        room = limit - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if self.layout.has_window:
            chunk = self.scheduler.prefill_chunk
            need = min(-(-(len(ids) + max_tokens) // self.layout.block_size), self.layout.window_blocks_per_sequence(chunk))
            if need > self.window_blocks:
                raise RequestError(
                    f"the request needs up to {need} blocks in the sliding-window layers' KV cache, which holds "
                    f"{self.window_blocks} (raise kv_pool_gb or lower prefill_chunk)"
                )
        return Admission(max_tokens, spans)

    def _context_limit(self, tokens: int) -> str:
        """What holds fewer than `tokens` tokens (a prompt and one generated token), and what to change:
        the context (the model's, or max_context), else the device KV cache (by how much)."""
        if tokens > self.max_context:
            holds = f"holds {self.max_context} tokens (prompt plus at least one generated token)"
            if self.max_context == self.model_context:
                return f"the model's context {holds}"
            return f"max_context {holds}; the model takes up to {self.model_context}"
        sched = self.scheduler
        if sched.max_staged_blocks is not None:
            return (
                f"a step stages {self.max_sequence_tokens} tokens of KV with kv_offload_tokens "
                f"{self.kv_offload_tokens} and the device and host tiers (prompt plus at least one generated "
                "token): raise kv_offload_tokens or host_tier_gb"
            )
        advice = context_advice(self.layout, tokens, sched.prefill_chunk, sched.max_num_seqs)
        return (
            f"the device KV cache holds {self.max_sequence_tokens} tokens (prompt plus at least one generated token); "
            f"{advice} (wicore plan --context {tokens} shows what else fits)"
        )
