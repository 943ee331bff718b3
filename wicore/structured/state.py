"""One request's place in its grammar: which tokens may come next, advanced token by token.

    fill_masks(out, drafts)   out[0]: the mask at the current position; out[i]: after drafts[:i]
                              (a draft the grammar refuses leaves the rows after it all zero)
    accept(token)             the token was generated: advance
    rollback(n)               forget the last n accepted tokens
    num_valid(tokens)         how many of `tokens`, in order, the grammar allows from here

`is_finished`: the grammar can take no more tokens (only an end-of-sequence token): the request ends.
Only the engine thread touches a state, and only while no mask of it is being computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llguidance import LLMatcher

from wicore.structured.bitmask import num_words


class GrammarState:
    def __init__(self, matcher: LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.num_tokens = 0  # tokens accepted so far (what rollback can undo)

    @property
    def num_words(self) -> int:
        return num_words(self.vocab_size)

    def fill_masks(self, out: np.ndarray, draft_ids: Sequence[int] = ()) -> None:
        """Masks at the current position and after each prefix of `draft_ids` into `out`
        [len(draft_ids) + 1, num_words] int32 (C-contiguous); the state is left where it was."""
        assert out.dtype == np.int32 and out.flags.c_contiguous and out.shape == (len(draft_ids) + 1, self.num_words)
        row_bytes = self.num_words * 4
        m = self._matcher
        m.unsafe_compute_mask_ptr(out.ctypes.data, row_bytes)
        taken = 0
        for i, token in enumerate(draft_ids):
            if m.validate_tokens([token]) != 1:  # refused: consuming it would break the matcher for good
                out[i + 1 :] = 0
                break
            m.consume_token(token)
            taken += 1
            m.unsafe_compute_mask_ptr(out[i + 1 :].ctypes.data, row_bytes)
        if taken:
            m.rollback(taken)

    def masks(self, draft_ids: Sequence[int] = ()) -> np.ndarray:
        out = np.zeros((len(draft_ids) + 1, self.num_words), np.int32)
        self.fill_masks(out, draft_ids)
        return out

    def accept(self, token_id: int) -> bool:
        """Advance by a generated token; False (and the state unchanged) when the grammar refuses it."""
        if self._matcher.validate_tokens([token_id]) != 1:
            return False
        ok = self._matcher.consume_token(token_id)
        assert ok, "validated tokens are consumed"
        self.num_tokens += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot roll back {num_tokens} tokens of {self.num_tokens}")
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self.num_tokens -= num_tokens

    def num_valid(self, token_ids: Sequence[int]) -> int:
        """How many of `token_ids`, from the first, the grammar allows from the current position."""
        return self._matcher.validate_tokens(list(token_ids)) if token_ids else 0

    @property
    def is_finished(self) -> bool:
        """No token but end-of-sequence can follow: the output is complete."""
        return self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is complete (more may still follow)."""
        return self._matcher.is_accepting()
