"""Packed token bitmasks: one bit per token id, 32 to an int32 word (llguidance's layout).

    word i, bit j  ->  token 32 * i + j  (1: the grammar allows it)

A mask row for a 262,144-token vocabulary is 8,192 words (32 KiB), against 1 MiB of float32 logits.
"""

from __future__ import annotations

import numpy as np


def num_words(vocab_size: int) -> int:
    """int32 words of one mask row."""
    return (vocab_size + 31) // 32


def allowed(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """One mask row as booleans, one per token id."""
    return np.unpackbits(mask.view(np.uint8), count=vocab_size, bitorder="little").view(np.bool_)


def is_allowed(mask: np.ndarray, token_id: int) -> bool:
    """Whether one mask row allows `token_id`."""
    return bool((int(mask[token_id >> 5]) >> (token_id & 31)) & 1)


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids one mask row allows, ascending."""
    return np.flatnonzero(allowed(mask, vocab_size))


def apply_bitmask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A copy of one row of logits with every token the mask refuses at -inf (the row's own
    buffer, often the graph's output, is left alone).

    Most masks allow a few tokens (a JSON key, a digit): those are gathered into a row of -inf
    (~0.1 ms for 262K logits); a mask that allows many goes through one `np.where` (~0.5-1.5 ms).
    `np.copyto(..., where=)` would cost ~12 ms on a mask of scattered bits (docs/PERFORMANCE.md)."""
    keep = allowed(mask, logits.shape[-1])
    ids = np.flatnonzero(keep)
    if len(ids) > len(keep) // 4:
        return np.where(keep, logits, logits.dtype.type(-np.inf))
    out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
    out[ids] = logits[ids]
    return out
