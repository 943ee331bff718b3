"""Draft proposers for speculative decoding: tokens a sequence is likely to continue with.

A proposer only guesses; the target model's verification row decides what is kept
(wicore.engine.speculative), so a bad guess costs time, never a different text.

    n-gram prompt lookup (no second model), for the sequence  ... a b c x y z ... a b c |
        the latest n-gram (a b c, n from ngram_max down to ngram_min) is looked up in the
        sequence's earlier tokens (prompt and output); the tokens after its most recent
        earlier occurrence (x y z ...) are the draft. vLLM's `ngram` method, llama.cpp's lookup.

    a draft model (DraftModelProposer): a smaller model with the same tokenizer continues the
        sequence greedily on its own engine and KV cache (prefix-cached, so each step computes
        only the tokens the target accepted since the last one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Proposer(Protocol):
    def propose(self, sequences: dict[str, Sequence[int]], num_tokens: dict[str, int]) -> dict[str, list[int]]:
        """At most `num_tokens[id]` draft tokens to follow each sequence (by request id); a sequence
        may get none."""
        ...

    def close(self) -> None: ...


class NgramProposer:
    """Prompt lookup: the continuation of the latest n-gram's most recent earlier occurrence."""

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {ngram_min} and {ngram_max}")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def propose(self, sequences: dict[str, Sequence[int]], num_tokens: dict[str, int]) -> dict[str, list[int]]:
        out = {}
        for request_id, token_ids in sequences.items():
            draft = ngram_lookup(token_ids, num_tokens[request_id], self.ngram_max, self.ngram_min)
            if draft:
                out[request_id] = draft
        return out

    def close(self) -> None:
        pass


def ngram_lookup(token_ids: Sequence[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the sequence's last
    n tokens, trying n = ngram_max first, down to ngram_min; [] when none occurs earlier.

    tokens  5 1 2 3 9 4 1 2 3 | : the suffix (1 2 3) occurred at 1..3, so the draft is 9 4 1 ...
    """
    if k <= 0:
        return []
    tokens = np.asarray(token_ids, np.int64)
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        # windows starting at 0 .. length - n - 1: every occurrence that ends before the suffix starts to overlap the end
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return [int(t) for t in tokens[start : start + k]]
    return []
