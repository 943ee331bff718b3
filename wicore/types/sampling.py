"""How a request samples (`SamplingParams`) and what each sampled token carries (`Sample`,
`Logprobs`): the public types the API, the engine and the sampler share."""

from __future__ import annotations

import math
from dataclasses import dataclass

from wicore.errors import RequestError

MAX_LOGPROBS = 20  # most alternatives a request may ask for (OpenAI's top_logprobs limit)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 16  # None: as many as the context and the KV cache leave room for
    temperature: float = 0.0  # 0 selects greedy decoding
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # OpenAI's penalties on tokens this request already generated (its prompt not counted):
    # logit -= presence_penalty * (count > 0) + frequency_penalty * count
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the k most likely
    prompt_logits: bool = False  # also return the logits at every prompt position (no prefix-cache reuse)
    speculative: bool = True  # False: this request never runs draft tokens (where the engine speculates)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise RequestError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise RequestError(f"seed must be >= 0, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class Logprobs:
    """One generated token's log probability under the raw model distribution, and the
    `len(top_ids)` most likely tokens' (most likely first, ties by token id)."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprobs: Logprobs | None = None  # only when the request asked for them
