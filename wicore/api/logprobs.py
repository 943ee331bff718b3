"""Token logprobs in OpenAI's two shapes, and which tokens go out with which piece of text.

    engine Logprobs ──► LogprobQueue (filed by text offset) ──► Piece.logprobs ──► chat / completion shape

A token goes out with the piece that sends the first character of its text; a token with
no text of its own yet (half a UTF-8 character, held back by the decoder or by a possible
stop string) waits for the next piece. When a stop string cuts the text, the tokens that
begin at or after the cut are dropped with it. Values are the raw model distribution's
(before penalties and temperature), as vLLM reports them by default.

    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
                  "refusal": null}
    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}], "text_offset": [...]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wicore.types.sampling import Logprobs

if TYPE_CHECKING:
    from wicore.inputs.tokenizer import Tokenizer

MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI and vLLM report this floor instead


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's logprobs and where its text begins in the choice's text."""

    offset: int
    logprobs: Logprobs


class LogprobQueue:
    """The tokens of one choice whose text has not been sent yet."""

    def __init__(self) -> None:
        self._pending: list[TokenLogprobs] = []

    def add(self, offset: int, logprobs: Logprobs) -> None:
        self._pending.append(TokenLogprobs(offset, logprobs))

    def take(self, num_sent: int) -> list[TokenLogprobs]:
        """The tokens whose text begins within the first `num_sent` characters (in order)."""
        if not self._pending:  # no logprobs asked for: every piece of the stream
            return []
        n = next((i for i, t in enumerate(self._pending) if t.offset >= num_sent), len(self._pending))
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def take_all(self) -> list[TokenLogprobs]:
        out, self._pending = self._pending, []
        return out


class LogprobFormatter:
    """Token strings and bytes through the tokenizer, cached per response."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._strings: dict[int, tuple[str, list[int]]] = {}

    def token(self, token_id: int) -> tuple[str, list[int]]:
        """The token's text alone (special tokens as written) and its bytes (Tokenizer.token_bytes);
        a token that is part of a character (`<0xE2>`, a byte-level piece of an emoji) has those
        bytes and the text U+FFFD."""
        if token_id not in self._strings:
            raw = self.tokenizer.token_bytes(token_id)
            self._strings[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return self._strings[token_id]

    def key(self, token_id: int) -> str:
        """The token as completions' `tokens` and `top_logprobs` keys write it: its text, or for
        part of a character OpenAI's `bytes:\\xe2\\x80` (two such tokens never share a key)."""
        text, raw = self.token(token_id)
        if "\ufffd" in text and text.encode("utf-8") != bytes(raw):
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text

    def chat(self, tokens: list[TokenLogprobs]) -> dict[str, Any]:
        content = []
        for t in tokens:
            lp = t.logprobs
            top = [self._entry(i, v) for i, v in zip(lp.top_ids, lp.top_logprobs)]
            content.append({**self._entry(lp.token_id, lp.logprob), "top_logprobs": top})
        return {"content": content, "refusal": None}

    def completion(self, tokens: list[TokenLogprobs]) -> dict[str, Any]:
        """OpenAI's legacy shape: each top_logprobs dict holds the k most likely tokens and
        always the chosen one, so up to k + 1 entries."""
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t in tokens:
            lp = t.logprobs
            top = {self.key(i): _floor(v) for i, v in zip(lp.top_ids, lp.top_logprobs)}
            top.setdefault(self.key(lp.token_id), _floor(lp.logprob))
            out["tokens"].append(self.key(lp.token_id))
            out["token_logprobs"].append(_floor(lp.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(t.offset)
        return out

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self.token(token_id)
        return {"token": text, "logprob": _floor(logprob), "bytes": raw}


def _floor(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
