"""Speculative sampling (Sampler.verify) draws each token from the sampler's own distribution,
whatever the guess: checked against the exact distribution over many seeded draws, with a
threshold that accepting every guess fails."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from wicore.executor.sampler import Sampler, candidates, temperature_weights
from wicore.types.sampling import SamplingParams

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
@pytest.mark.slow  # 19 s on the 2-core VM, loaded
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


class FixedProposer:
    """Always guesses `token` (any proposer is allowed: verification decides)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, sequences, num_tokens):
        return {request_id: [self.token] * num_tokens[request_id] for request_id in sequences}

    def close(self) -> None:
        pass


@pytest.mark.slow  # 9 s on the 2-core VM, loaded
def test_the_engine_samples_the_models_distribution_with_speculation(tiny_export):
    """Tiny random Gemma 3, temperature 1, top-k 4: the pair (first token, second token) of 1,500
    seeded requests, whose second token always comes out of a verification row, against the exact
    joint distribution from HF transformers' logits. A fixed guess that were always accepted would
    be far off (the assertion on `accept_all`)."""
    import torch

    from wicore.engine.engine import Engine, EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.engine.speculative import SpeculativeConfig, Speculator

    folder, model = tiny_export(1)
    prompt = [5, 17, 99, 23, 5, 17, 99]
    top_k, num_requests = 4, 1500

    def top_probs(ids: list[int]) -> dict[int, float]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        values, idx = torch.topk(logits, top_k)
        return dict(zip(idx.tolist(), torch.softmax(values, 0).tolist()))

    exact = {(a, b): pa * pb for a, pa in top_probs(prompt).items() for b, pb in top_probs([*prompt, a]).items()}
    second = {}
    for (_, b), p in exact.items():
        second[b] = second.get(b, 0.0) + p
    guess = max(second, key=second.__getitem__)  # the likeliest second token: often right, often not
    accept_all = sum(p for (_, b), p in exact.items() if b != guess)  # TV of always taking the guess
    assert accept_all > 0.3

    spec = SpeculativeConfig("ngram", num_speculative_tokens=1, max_batch=num_requests)
    config = EngineConfig(
        model_dir=folder,
        num_threads=1,
        block_size=4,
        num_device_blocks=2048,
        verify_files=False,
        speculative=spec,
        scheduler=SchedulerConfig(max_waiting=num_requests),
    )
    params = [SamplingParams(max_tokens=3, ignore_eos=True, temperature=1.0, top_k=top_k, seed=i) for i in range(num_requests)]
    with Engine(config) as engine:
        engine.core.speculator = Speculator(spec, FixedProposer(guess))
        completions = engine.generate([prompt] * num_requests, params)
        stats = engine.stats().speculative
    assert stats.num_drafts == num_requests  # every second token was verified
    counts: dict[tuple[int, int], int] = {}
    for c in completions:
        key = (c.token_ids[0], c.token_ids[1])
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / num_requests - p) for k, p in exact.items())
    assert tv < 0.06  # the expected sampling noise of 1,500 draws over 16 outcomes: ~0.04 (the seeds are fixed)
