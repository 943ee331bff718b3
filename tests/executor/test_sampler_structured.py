"""The host sampler under a grammar's mask: every choice is of the masked distribution, the
model's renormalised over the allowed tokens (statistical, seeded). The expected distributions are
computed here from the logits and a boolean mask, not by the sampler."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.executor.sampler import Sampler, log_softmax
from wicore.structured.bitmask import num_words
from wicore.types.sampling import SamplingParams

VOCAB = 300
RNG = np.random.default_rng(7)
LOGITS = (RNG.normal(size=VOCAB) * 1.5).astype(np.float32)
ALLOWED = np.zeros(VOCAB, bool)
ALLOWED[RNG.choice(VOCAB, 40, replace=False)] = True
ALLOWED[int(np.argmax(LOGITS))] = False  # the model's favourite is refused: the mask must matter


def packed(allowed: np.ndarray) -> np.ndarray:
    bits = np.packbits(allowed.astype(np.uint8), bitorder="little")
    out = np.zeros(num_words(len(allowed)) * 4, np.uint8)
    out[: len(bits)] = bits
    return out.view(np.int32)


MASK = packed(ALLOWED)


def renormalised(logits: np.ndarray, allowed: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    p = np.exp((logits.astype(np.float64) - logits.max()) / temperature) * allowed
    return p / p.sum()


def assert_follows(tokens: np.ndarray, expected: np.ndarray) -> None:
    """Counts agree with `expected` (chi-square over the tokens it allows, 6 sigma) and nothing
    outside its support is ever drawn."""
    counts = np.bincount(tokens, minlength=len(expected))
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    e = expected[support] * len(tokens)
    chi2 = float(((counts[support] - e) ** 2 / e).sum())
    df = int(support.sum()) - 1
    assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df)


def draws(params: SamplingParams, n: int = 6000) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(LOGITS, MASK).token_id for _ in range(n)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_follows_the_masked_distribution(temperature):
    assert_follows(draws(SamplingParams(temperature=temperature, seed=11)), renormalised(LOGITS, ALLOWED, temperature))


@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_top_k_and_top_p_cut_the_masked_distribution():
    p = renormalised(LOGITS, ALLOWED)
    order = np.lexsort((np.arange(VOCAB), -p))
    top5 = np.zeros(VOCAB, bool)
    top5[order[:5]] = True
    assert_follows(draws(SamplingParams(temperature=1.0, top_k=5, seed=2)), renormalised(LOGITS, ALLOWED & top5))
    nucleus = np.zeros(VOCAB, bool)
    nucleus[order[: int(np.searchsorted(np.cumsum(p[order]), 0.8)) + 1]] = True
    assert_follows(draws(SamplingParams(temperature=1.0, top_p=0.8, seed=3)), renormalised(LOGITS, ALLOWED & nucleus))


def test_greedy_takes_the_best_allowed_token_and_penalties_apply_within_the_mask():
    best = int(np.argmax(np.where(ALLOWED, LOGITS, -np.inf)))
    assert Sampler(SamplingParams()).sample(LOGITS, MASK).token_id == best
    sampler = Sampler(SamplingParams(frequency_penalty=2.0, presence_penalty=2.0))
    picks = [sampler.sample(LOGITS, MASK).token_id for _ in range(3)]
    assert picks[0] == best and len(set(picks)) == 3 and all(ALLOWED[picks])


def test_logprobs_are_those_of_the_masked_distribution():
    sample = Sampler(SamplingParams(logprobs=5)).sample(LOGITS, MASK)
    with np.errstate(divide="ignore"):
        expected = np.log(renormalised(LOGITS, ALLOWED))
    assert sample.logprobs is not None
    assert sample.logprobs.logprob == pytest.approx(expected[sample.token_id], abs=1e-9)
    top = np.argsort(-expected, kind="stable")[:5]
    assert list(sample.logprobs.top_ids) == top.tolist()
    np.testing.assert_allclose(sample.logprobs.top_logprobs, expected[top], atol=1e-9)
    assert np.isneginf(log_softmax(np.where(ALLOWED, LOGITS, -np.inf))[~ALLOWED]).all()


def test_verification_never_keeps_a_refused_draft_and_keeps_the_masked_distribution():
    refused = int(np.argmax(LOGITS))
    sampler = Sampler(SamplingParams(temperature=1.0, seed=5))
    tokens = []
    for _ in range(6000):
        sample, kept = sampler.verify(LOGITS, refused, MASK)
        assert not kept
        tokens.append(sample.token_id)
    assert_follows(np.array(tokens), renormalised(LOGITS, ALLOWED))
    allowed_draft = int(np.flatnonzero(ALLOWED)[0])
    greedy = Sampler(SamplingParams())
    assert greedy.verify(LOGITS, allowed_draft, MASK)[1] == (allowed_draft == int(np.argmax(np.where(ALLOWED, LOGITS, -np.inf))))


def test_a_mask_that_allows_nothing_fails_the_row():
    with pytest.raises(RuntimeError, match="allows no token"):
        Sampler(SamplingParams()).sample(LOGITS, packed(np.zeros(VOCAB, bool)))
