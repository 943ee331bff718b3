"""Token selection from logits on the host: greedy, or seeded temperature / top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wicore.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 selects greedy decoding
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise RequestError(f"seed must be >= 0, got {self.seed}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Picks one token per logits row; one seeded generator per sequence keeps runs repeatable."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.is_greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        candidates = np.arange(scaled.shape[-1])
        if p.top_k and p.top_k < scaled.shape[-1]:
            candidates = np.argpartition(-scaled, p.top_k - 1)[: p.top_k]
        # Most likely first; ties broken by token id so the order is deterministic.
        candidates = candidates[np.lexsort((candidates, -scaled[candidates]))]
        probs = np.exp(scaled[candidates] - scaled[candidates[0]])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(len(candidates), p=probs)])
