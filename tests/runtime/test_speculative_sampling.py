"""Speculative sampling (Sampler.verify) draws each token from the sampler's own distribution,
whatever the guess: checked against the exact distribution over many seeded draws, with a
threshold that accepting every guess fails."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from wicore.runtime.sampler import Sampler, SamplingParams, candidates, temperature_weights

LOGITS = np.array([2.0, 1.5, 0.3, -1.0, 0.0, 1.0, -3.0, 0.7], np.float32)
NUM_DRAWS = 20_000
MAX_TV = 0.015  # total variation of 20,000 draws over 8 tokens from the truth: ~0.006 expected


def exact(params: SamplingParams) -> np.ndarray:
    weights = temperature_weights(LOGITS, params.temperature)
    kept = candidates(weights, params.top_k, params.top_p)
    probs = np.zeros(len(LOGITS))
    if kept is None:
        probs = weights / weights.sum()
    else:
        probs[kept[0]] = kept[1]
    return probs


def tv(counts: np.ndarray, probs: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - probs).sum())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
)
@pytest.mark.parametrize("draft", [0, 5, 6])  # the likeliest token, a middling one, one top-k / top-p may cut
def test_verified_tokens_follow_the_samplers_distribution(params, draft):
    sampler = Sampler(replace(params, seed=11))
    counts = np.zeros(len(LOGITS))
    num_kept = 0
    for _ in range(NUM_DRAWS):
        sample, kept = sampler.verify(LOGITS, draft)
        counts[sample.token_id] += 1
        num_kept += kept
        assert kept == (sample.token_id == draft)
    probs = exact(params)
    assert tv(counts, probs) < MAX_TV
    # the guess is kept as often as the sampler would pick it
    assert abs(num_kept / NUM_DRAWS - probs[draft]) < 0.015
    # accepting every guess (a wrong implementation) is far from the distribution: the test tells them apart
    always = np.zeros(len(LOGITS))
    always[draft] = NUM_DRAWS
    assert tv(always, probs) > 10 * MAX_TV


def test_verification_repeats_with_the_seed_and_is_greedy_at_temperature_0():
    params = SamplingParams(temperature=1.0, seed=3)
    a = [Sampler(params).verify(LOGITS, 1)[0].token_id for _ in range(5)]
    s = Sampler(params)
    assert [s.verify(LOGITS, 1)[0].token_id for _ in range(1)] == a[:1]
    assert Sampler(SamplingParams()).verify(LOGITS, 1)[1] is False
    sample, kept = Sampler(SamplingParams()).verify(LOGITS, 0)
    assert (sample.token_id, kept) == (0, True)


def test_logprobs_of_a_verified_token_are_the_raw_distributions():
    sample, _ = Sampler(SamplingParams(temperature=1.0, seed=0, logprobs=2)).verify(LOGITS, 0)
    assert sample.logprobs is not None
    raw = LOGITS.astype(np.float64) - np.log(np.exp(LOGITS.astype(np.float64)).sum())
    assert sample.logprobs.top_ids == (0, 1)
    np.testing.assert_allclose(sample.logprobs.logprob, raw[sample.token_id])
