"""A request's state as the scheduler tracks it (what it reports back: wicore.types.outputs)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from wicore.structured.state import GrammarState
from wicore.types.images import ImageSpan, block_keys, chunk_end
from wicore.types.outputs import Priority
from wicore.types.sampling import SamplingParams

LONG_ROPE_KEY = b"long-rope"  # hashed into the first block of a sequence whose keys take LongRoPE's long factors


class Status(enum.Enum):
    WAITING = "waiting"  # not started, or preempted by recompute (its blocks were freed)
    RUNNING = "running"  # owns DEVICE blocks and is scheduled every step
    SWAPPED = "swapped"  # preempted by swap: some of its blocks are on HOST / NVME
    FINISHED = "finished"


@dataclass
class Request:
    """One sequence. Its tokens are prompt + output; `num_computed` of them have KV in the cache.

    token_ids  [ prompt ................ | output ...... ]
               [ computed (KV cached)  |  to run      ]
                                   num_computed
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int  # params.max_tokens, capped by the room the context and the KV cache leave
    priority: Priority
    arrival: float
    deadline: float | None = None
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    was_admitted: bool = False
    status: Status = Status.WAITING
    seq_id: int = 0  # key of its blocks in the KV cache
    prompt_logits: list[np.ndarray] = field(default_factory=list)  # chunks so far, if params.prompt_logits
    image_spans: tuple[ImageSpan, ...] = ()  # the prompt's images (wicore.types.images)
    grammar: GrammarState | None = None  # params.structured, compiled: where its output tokens have taken it
    # LongRoPE (the scheduler sets it at admission): tokens [0, whole_until) run in one chunk, so
    # every key takes the long factors (the graph picks them by a row's last position this step),
    # and its blocks hash apart from short-factor ones; 0: no such rule
    whole_until: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_output_tokens(self) -> int:
        """len(output_ids), without copying them (asked for every token of every request)."""
        return len(self.token_ids) - len(self.prompt_ids)

    def chunk(self, limit: int) -> int:
        """Tokens to run from num_computed when at most `limit` may: never an image in part
        (wicore.graph.io: its tokens attend to each other), nor [0, whole_until) in part, so
        possibly fewer, or none."""
        end = chunk_end(self.image_spans, self.num_computed, self.num_computed + limit)
        if self.num_computed < self.whole_until and end < self.whole_until:
            return 0
        return end - self.num_computed

    def images_in(self, start: int, stop: int) -> tuple[ImageSpan, ...]:
        """The images with soft tokens in positions [start, stop)."""
        return tuple(s for s in self.image_spans if s.start < stop and start < s.stop)

    def extra_keys(self, block_size: int) -> dict[int, bytes]:
        """What the prefix cache hashes with each block's token ids: the digests of its images,
        and (whole_until) LongRoPE's long factors on the first block, so the whole chain differs."""
        keys = block_keys(self.image_spans, block_size)
        if self.whole_until:
            keys[0] = keys.get(0, b"") + LONG_ROPE_KEY
        return keys

    @property
    def wants_prompt_logits(self) -> bool:
        """Still prefilling a prompt whose every position's logits were asked for (a recompute
        after the first token needs none: they were sent with it)."""
        return self.params.prompt_logits and self.num_output_tokens == 0

    def rank(self, aging_seconds: float, now: float | None = None) -> tuple[int, float]:
        """The scheduler's order (smallest first): higher priority, then earlier arrival. At `now`, a
        waiting request's priority has risen one level every `aging_seconds` (0: never)."""
        priority = int(self.priority)
        if now is not None and aging_seconds > 0:
            priority = min(int(Priority.URGENT), priority + int((now - self.arrival) / aging_seconds))
        return (-priority, self.arrival)

    def is_prefilling_a_block_of(self, other: Request, block_size: int) -> bool:
        """Whether the next full block this request computes is still of its prompt, and `other`'s
        tokens start with the same tokens up to that block's end."""
        boundary = (self.num_computed // block_size + 1) * block_size
        within = boundary <= min(len(self.prompt_ids), len(other.token_ids)) and not self.image_spans
        return within and self.token_ids[:boundary] == other.token_ids[:boundary]
