"""How a request samples (`SamplingParams`) and what each sampled token carries (`Sample`,
`Logprobs`): the public types the API, the engine and the sampler share."""

from __future__ import annotations

from dataclasses import dataclass

from wicore.errors import RequestError
from wicore.structured.spec import StructuredOutput
from wicore.types.limits import LOGIT_BIAS, MAX_LOGPROBS, RANGES


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
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logits (-100 bans, +100 forces).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's extensions. min_p: drop tokens less likely than min_p x the likeliest one (after the
    # temperature). repetition_penalty: every token of the prompt or the output so far has its
    # logit divided by it where positive, multiplied by it where negative (1: off).
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    structured: StructuredOutput | None = None  # what the output must match (a JSON schema, regex, ...): masked

    def __post_init__(self) -> None:
        for name, allowed in RANGES.items():  # the API checks requests against the same ranges
            value = getattr(self, name)
            if value not in allowed:
                raise RequestError(f"{name} must be in {allowed}, got {value}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and self.seed < 0:
            raise RequestError(f"seed must be >= 0, got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or bias not in LOGIT_BIAS:
                raise RequestError(f"logit_bias: token {token_id} with bias {bias}: ids >= 0, biases in {LOGIT_BIAS}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether the scores depend on the tokens seen so far (presence, frequency, repetition)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def changes_logits(self) -> bool:
        """Whether the token is chosen from other scores than the raw logits (so a greedy pick is
        not their argmax): penalties or a logit bias."""
        return self.has_penalties or bool(self.logit_bias)


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
