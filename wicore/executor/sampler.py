"""Token selection from logits on the host: greedy, or seeded temperature / top-k / top-p
(the request's `SamplingParams`, wicore.types.sampling).

Per step, for one request (the order of vLLM's sampler):

    raw logits ─┬─► (if asked) log_softmax ──► Logprobs of the chosen token and the top k
                └─► logit_bias ─► repetition penalty ─► presence, frequency penalties
                      ─► temperature ─► min-p ─► top-k ─► top-p ─► token

Logprobs are those of the raw model distribution, before penalties and temperature: vLLM's
default (`logprobs_mode="raw_logprobs"`). They cost one softmax over the vocabulary, so they
are computed only for requests that ask for them.

A constrained request (`structured`) passes its grammar's mask (wicore.structured.bitmask) with
the logits: the tokens it refuses are at -inf before anything else, so every choice above (and the
logprobs, as vLLM reports them) is of the masked distribution, the model's renormalised over the
allowed tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from wicore.graph.sampling import CDF_BLOCK  # one block size here and in the graph's draw: the same tokens
from wicore.structured.bitmask import apply_bitmask
from wicore.types.sampling import Logprobs, Sample, SamplingParams


def masked(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The logits with the tokens `mask` refuses at -inf (the logits themselves without a mask)."""
    if mask is None:
        return logits
    out = apply_bitmask(logits, mask)
    if not np.isfinite(out).any():
        raise RuntimeError("the request's grammar allows no token here")
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def top_logprobs(logprobs: np.ndarray, token_id: int, k: int) -> Logprobs:
    """The chosen token's entry and the k most likely tokens of a log_softmax row."""
    k = min(k, logprobs.shape[-1])
    top = np.argpartition(-logprobs, k - 1)[:k] if k else np.arange(0)
    top = top[np.lexsort((top, -logprobs[top]))]
    return Logprobs(token_id, float(logprobs[token_id]), tuple(int(i) for i in top), tuple(float(v) for v in logprobs[top]))


class Sampler:
    """Picks one token per logits row; one per request: it keeps the request's seeded
    generator (runs repeat) and, with penalties, the counts of the tokens it picked."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int] = ()) -> None:
        """`prompt_ids`: the request's prompt, which the repetition penalty counts as seen."""
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}  # token id -> times picked (kept only with penalties)
        self.prompt_ids = np.unique(np.asarray(prompt_ids, np.int64)) if params.repetition_penalty != 1.0 else None
        self.bias = (
            (np.array([i for i, _ in params.logit_bias], np.int64), np.array([b for _, b in params.logit_bias], np.float64))
            if params.logit_bias
            else None
        )

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> Sample:
        """The next token from one row of logits; `mask`: the packed tokens a grammar allows."""
        p = self.params
        logits = masked(logits, mask)
        scores = self.penalized(logits) if p.changes_logits else logits
        token = int(np.argmax(scores)) if p.is_greedy else self._draw(scores)
        return self._sample_of(logits, token)

    def verify(self, logits: np.ndarray, draft_id: int, mask: np.ndarray | None = None) -> tuple[Sample, bool]:
        """The token at a position where a proposer guessed `draft_id`, and whether it is the guess.

        Greedy: the argmax (the guess is kept when it is the argmax). Tempered: speculative
        sampling (Leviathan et al. 2023, Chen et al. 2023) with a proposal that puts all its mass
        on the guess: the guess is kept with probability p(guess), else a token is drawn from p
        without the guess, renormalized. Either way the token is distributed as `sample` draws it
        (p: this sampler's distribution, after penalties, temperature, top-k and top-p), from the
        request's seeded generator. `mask`: as in `sample`."""
        p = self.params
        logits = masked(logits, mask)
        scores = self.penalized(logits) if p.changes_logits else logits
        token = int(np.argmax(scores)) if p.is_greedy else self._verify_draw(scores, draft_id)
        return self._sample_of(logits, token), token == draft_id

    def _verify_draw(self, scores: np.ndarray, draft_id: int) -> int:
        weights = self._weights(scores)
        kept = candidates(weights, self.params.top_k, self.params.top_p)
        if kept is None:
            ids, probs = None, weights.astype(np.float64) / weights.sum(dtype=np.float64)
            prob = float(probs[draft_id])
        else:
            ids, probs = kept
            prob = float(probs[ids == draft_id].sum())
        if self.rng.random() < prob:
            return draft_id
        if ids is None:  # the whole distribution less the guess
            rest = weights.copy()
            rest[draft_id] = 0
            return _inverse_cdf(rest, self.rng.random())
        others = ids != draft_id
        return self._pick(ids[others], probs[others] / probs[others].sum())

    def _sample_of(self, logits: np.ndarray, token: int) -> Sample:
        """`token` as this request's sample: counted for penalties, with logprobs if asked."""
        p = self.params
        if p.has_penalties:
            self.counts[token] = self.counts.get(token, 0) + 1
        if p.logprobs is None:
            return Sample(token)
        return Sample(token, top_logprobs(log_softmax(logits), token, p.logprobs))

    def uniform(self) -> float:
        """The draw of a row that keeps the whole distribution (no top-k, no top-p), taken before a
        graph's sampling head turns it into the token (wicore.graph.sampling): `_draw`'s draw."""
        return float(self.rng.random())

    def from_candidates(self, probs: np.ndarray, ids: np.ndarray) -> int | None:
        """A top-k / top-p draw from the K most likely tokens (sampling head's `top_probs`,
        `top_ids`: tempered probabilities, most likely first): what `_draw` picks from the full
        logits, or None when the candidates do not hold the top-p nucleus (no top-k, and their
        mass is below top_p): then the logits decide. Tied candidates are put in token order first,
        as the host orders them: ONNX's TopK promises that, but an EP's kernel need not keep it (the
        CUDA EP's orders ties differently at different row counts, so a CUDA graph's padded bucket
        drew other tokens than the uncaptured step on near-flat distributions)."""
        p = self.params
        order = np.lexsort((ids, -probs))
        kept, ids = probs[order].astype(np.float64), ids[order]
        if p.top_k:  # top-p then cuts the top-k distribution
            kept, ids = kept[: p.top_k], ids[: p.top_k]
            kept /= kept.sum()
        keep = _nucleus(kept, p.top_p)
        if keep > len(kept) and not p.top_k:
            return None
        return self._pick(ids[:keep], kept[:keep] / kept[:keep].sum())

    def penalized(self, logits: np.ndarray) -> np.ndarray:
        """The logits (float64) with the logit bias, less the penalties of the tokens seen so far."""
        p = self.params
        scores = logits.astype(np.float64)
        if self.bias is not None:
            ids, bias = self.bias
            in_vocab = ids < len(scores)  # ids past the vocabulary (a padded LM head's) are no token
            scores[ids[in_vocab]] += bias[in_vocab]
        if self.prompt_ids is not None:
            seen = np.union1d(self.prompt_ids, np.fromiter(self.counts, np.int64, len(self.counts)))
            seen = seen[seen < len(scores)]
            values = scores[seen]
            scores[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts, np.int64, len(self.counts))
            counts = np.fromiter(self.counts.values(), np.float64, len(self.counts))
            scores[ids] -= p.presence_penalty + p.frequency_penalty * counts
        return scores

    def _weights(self, scores: np.ndarray) -> np.ndarray:
        """temperature_weights, less the tokens min-p drops (weight < min_p: the best token weighs 1)."""
        weights = temperature_weights(scores, self.params.temperature)
        if self.params.min_p > 0.0:
            weights[weights < np.float32(self.params.min_p)] = 0.0
        return weights

    def _draw(self, logits: np.ndarray) -> int:
        weights = self._weights(logits)
        kept = candidates(weights, self.params.top_k, self.params.top_p)
        if kept is None:  # the whole distribution: inverse CDF in token order, no sort
            return _inverse_cdf(weights, self.rng.random())
        return self._pick(*kept)

    def _pick(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """One of `ids`, drawn with their `probs` (summing to 1)."""
        return int(ids[self.rng.choice(len(ids), p=probs)])


# Gemma's vocabulary has 262K tokens. A sort of it costs ~60 ms a row and a partial one
# (argpartition) ~7 ms, more than a GPU decode step; the functions below make a few vectorized
# passes instead (~1-2 ms) and sort only the candidates.


def temperature_weights(logits: np.ndarray, temperature: float) -> np.ndarray:
    """exp((logits - max) / T) in float32: the unnormalized distribution, the best token(s) 1."""
    shifted = logits.astype(np.float32) - logits.max()  # <= 0: a tiny temperature gives -inf, not inf - inf
    with np.errstate(over="ignore"):
        return np.exp(shifted / np.float32(max(temperature, MIN_TEMPERATURE)))


MIN_TEMPERATURE = 1e-30  # below it float32 division overflows: the draw is already the argmax (ties aside)


def candidates(weights: np.ndarray, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The tokens top-k and then top-p keep, most likely first (ties by token id), with their
    renormalized probabilities; None when both keep everything."""
    if top_k and top_k < len(weights):
        ids = _top_k(_top(weights, lambda ids: len(ids) >= top_k), weights, top_k)
        total = weights[ids].sum(dtype=np.float64)  # top-p then cuts the top-k distribution
    elif top_p < 1.0:
        total = weights.sum(dtype=np.float64)
        ids = _top(weights, lambda ids: weights[ids].sum(dtype=np.float64) >= top_p * total)
    else:
        return None
    ids = ids[np.lexsort((ids, -weights[ids]))]
    probs = weights[ids].astype(np.float64) / total
    keep = _nucleus(probs, top_p)
    return ids[:keep], probs[:keep] / probs[:keep].sum()


def _nucleus(probs: np.ndarray, top_p: float) -> int:
    """How many of `probs` (most likely first) top-p keeps: the fewest whose sum reaches top_p
    (one past the end when they do not reach it)."""
    return int(np.searchsorted(np.cumsum(probs), top_p)) + 1 if top_p < 1.0 else len(probs)


def _top(weights: np.ndarray, enough: Callable[[np.ndarray], bool]) -> np.ndarray:
    """The ids (in token order) of every token within a log-margin of the best, the margin
    doubling until `enough` holds: a set that holds each most likely run of tokens."""
    margin = 4.0
    while True:
        ids = np.flatnonzero(weights >= np.float32(math.exp(-margin)))
        if enough(ids) or len(ids) == len(weights):
            return ids
        margin *= 2


def _top_k(ids: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """The k best of `ids` (in token order), ties at the k-th weight going to the lowest ids."""
    if len(ids) <= k:
        return ids
    values = weights[ids]
    kth = np.partition(values, len(values) - k)[len(values) - k]
    above = ids[values > kth]
    return np.concatenate([above, ids[values == kth][: k - len(above)]])


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The token whose cumulative weight (in token order) first exceeds u * total: block sums
    first, then one block's running sum, instead of a running sum over the vocabulary."""
    blocks = np.add.reduceat(weights, np.arange(0, len(weights), CDF_BLOCK), dtype=np.float64)
    cdf = np.cumsum(blocks)
    target = u * cdf[-1]
    block = min(int(np.searchsorted(cdf, target, side="right")), len(blocks) - 1)
    start = block * CDF_BLOCK
    inner = np.cumsum(weights[start : start + CDF_BLOCK], dtype=np.float64) + (cdf[block - 1] if block else 0.0)
    return start + min(int(np.searchsorted(inner, target, side="right")), len(inner) - 1)


def verify_row(
    draft_ids: Sequence[int],
    sampler: Sampler | None,
    logits: np.ndarray | None,
    argmax: np.ndarray | None,
    masks: np.ndarray | None = None,
) -> list[Sample]:
    """The tokens a verification row produces: the kept drafts and one more (module docstring).
    `logits` [k + 1, vocab] go through the request's sampler, with `masks` [k + 1, words] when the
    request has a grammar (position i: after the first i drafts); without logits (greedy rows, no
    logprobs, no grammar), `argmax` [k + 1] are the graph's greedy tokens."""
    samples = []
    for i in range(len(draft_ids) + 1):
        mask = None if masks is None else masks[i]
        if logits is None:
            assert argmax is not None and masks is None
            sample, kept = Sample(int(argmax[i])), i < len(draft_ids) and int(argmax[i]) == draft_ids[i]
        elif i < len(draft_ids):
            assert sampler is not None
            sample, kept = sampler.verify(logits[i], draft_ids[i], mask)
        else:
            assert sampler is not None
            sample, kept = sampler.sample(logits[i], mask), False
        samples.append(sample)
        if not kept:
            break
    return samples
