"""Speculative decoding: a decoding request runs its last token and k draft tokens as one row.

    row        | t  d1 d2 d3 |      t: the request's last token (no KV yet), d1..d3: a proposer's draft
    logits     | l0 l1 l2 l3 |      one per position: l0 decides the token after t, l1 the one after d1, ...
    verified   | x0 x1 x2    |      x_i from l_i (Sampler.verify); kept while x_i == d_{i+1}; the first
                                    x_i that differs (or x_k, when every draft is kept) ends the run

Every token kept is a token plain decoding would have produced (greedy: the argmax; sampled:
speculative sampling keeps the sampler's distribution), so speculation changes the speed, not
the text. The KV of the rejected drafts is rolled back (BlockGroups.truncate): their slots are
written again by later rows, their blocks past the kept tokens freed, and the prefix cache only
ever hashes computed (accepted) tokens.

Speculation backs off where it does not pay: a request whose drafts were mostly rejected lately
proposes nothing for a while, and no request speculates while more than `max_batch` decode
together (a step over a batch reads the weights once for every row already; docs/PERFORMANCE.md
measures where the gain ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wicore.engine.proposers import Proposer
from wicore.engine.request import Request
from wicore.types.step import RunResult, ScheduledRow

METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" (prompt lookup) or "draft" (a draft model, draft_model_dir)
    num_speculative_tokens: int = 4  # k: draft tokens a row runs at most
    draft_model_dir: Path | None = None
    draft_devices: str | None = None  # where the draft model runs (default: the target's devices)
    ngram_max: int = 4
    ngram_min: int = 1
    max_batch: int = 8  # no speculation while more requests than this decode in one step
    min_acceptance: float = 0.25  # a request whose recent drafts were accepted less than this backs off
    backoff_steps: int = 16  # ... for this many steps, then tries again

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r}: choose ngram or draft")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"the number of speculative tokens must be at least 1, got {self.num_speculative_tokens}")
        if (self.method == "draft") != (self.draft_model_dir is not None):
            raise ValueError("a draft model directory goes with the draft method only (not with ngram)")
        if self.max_batch < 1 or self.backoff_steps < 0 or not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError("max_batch must be >= 1, backoff_steps >= 0 and min_acceptance in [0, 1]")


@dataclass
class SpeculativeStats:
    """Counters with vLLM's meaning (vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens)."""

    num_drafts: int = 0  # verification rows run
    num_draft_tokens: int = 0  # draft tokens they carried
    num_accepted_tokens: int = 0  # of those, kept
    accepted_per_position: list[int] = field(default_factory=list)  # kept drafts at position 1, 2, ...

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verification row produced on average (kept drafts plus the one it always adds)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "accepted_per_position": list(self.accepted_per_position),
        }


@dataclass
class _Acceptance:
    rate: float = 1.0  # moving average of the accepted share of this request's drafts
    paused_until: int = 0  # the step from which it proposes again


class Speculator:
    """Which decoding requests get which drafts this step, and how well drafts did."""

    DECAY = 0.5  # weight of the newest row in a request's moving acceptance rate

    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config = config
        self.proposer = proposer
        self.stats = SpeculativeStats()
        self._requests: dict[str, _Acceptance] = {}
        self._step = 0

    def drafts(self, decoding: Sequence[Request]) -> dict[str, list[int]]:
        """Draft tokens for requests whose next row is a decode (at most k, and never past the
        tokens a request may still generate: a row adds its kept drafts plus one)."""
        self._step += 1
        if len(decoding) > self.config.max_batch:
            return {}
        wanted: dict[str, int] = {}
        sequences: dict[str, Sequence[int]] = {}
        for req in decoding:
            room = min(self.config.num_speculative_tokens, req.max_tokens - req.num_output_tokens - 1)
            state = self._requests.get(req.request_id)
            if not req.params.speculative or room < 1 or (state is not None and state.paused_until > self._step):
                continue
            wanted[req.request_id] = room
            sequences[req.request_id] = req.token_ids
        return self.proposer.propose(sequences, wanted) if wanted else {}

    def observe(self, rows: Sequence[ScheduledRow], result: RunResult) -> None:
        """Count the verification rows of a step that ran; back off requests whose drafts fail."""
        cfg = self.config
        for row in rows:
            samples = result.verified.get(row.request_id)
            if not row.draft_ids or samples is None:
                continue
            num_draft, num_kept = len(row.draft_ids), len(samples) - 1
            s = self.stats
            s.num_drafts += 1
            s.num_draft_tokens += num_draft
            s.num_accepted_tokens += num_kept
            s.accepted_per_position += [0] * (num_draft - len(s.accepted_per_position))
            for i in range(num_kept):
                s.accepted_per_position[i] += 1
            state = self._requests.setdefault(row.request_id, _Acceptance())
            state.rate = (1 - self.DECAY) * state.rate + self.DECAY * num_kept / num_draft
            if state.rate < cfg.min_acceptance:
                state.paused_until = self._step + cfg.backoff_steps + 1  # drafts() counts the next step first
                state.rate = cfg.min_acceptance  # one good row after the pause lifts it again

    def forget(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._requests.pop(request_id, None)

    def close(self) -> None:
        self.proposer.close()
