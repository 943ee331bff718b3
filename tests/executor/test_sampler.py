"""Host-side sampling: exact choices on small hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.errors import RequestError
from wicore.executor.sampler import Sampler, candidates, temperature_weights
from wicore.types.sampling import SamplingParams

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], np.float32))  # probs by token id


def draws(params: SamplingParams, n: int = 2000) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(LOGITS).token_id for _ in range(n)])


def test_greedy_takes_the_argmax_and_the_first_of_ties():
    assert Sampler(SamplingParams()).sample(LOGITS).token_id == 1
    assert Sampler(SamplingParams()).sample(np.array([0.0, 2.0, 2.0], np.float32)).token_id == 1


def test_top_k_keeps_only_the_k_most_likely():
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, seed=0))) == {1, 3}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # 0.4 + 0.3 = 0.7 < 0.75, so 0.15 (token 4) is needed too; token 2 (0.1) and 0 (0.05) are not.
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.75, seed=0))) == {1, 3, 4}


def test_temperature_one_follows_the_distribution():
    counts = np.bincount(draws(SamplingParams(temperature=1.0, seed=3), n=20000), minlength=5) / 20000
    np.testing.assert_allclose(counts, [0.05, 0.4, 0.1, 0.3, 0.15], atol=0.015)


def test_low_temperature_sharpens():
    assert (draws(SamplingParams(temperature=0.05, seed=1)) == 1).mean() > 0.99


def test_seed_repeats_and_differs():
    p = SamplingParams(temperature=1.0, seed=42)
    assert (draws(p, 50) == draws(p, 50)).all()
    assert not (draws(p, 50) == draws(SamplingParams(temperature=1.0, seed=43), 50)).all()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "max_tokens"),
        ("temperature", -1.0, "temperature"),
        ("top_k", -2, "top_k"),
        ("top_p", 0.0, "top_p"),
        ("seed", -1, "seed"),
    ],
)
def test_invalid_params_are_rejected(field, value, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**{field: value})


def numpy_log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - x.max() - np.log(np.sum(np.exp(x - x.max())))


def test_penalties_subtract_exactly_presence_plus_frequency_times_count():
    sampler = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    sampler.counts = {1: 3, 4: 1}
    expected = LOGITS.astype(np.float64)
    expected[1] -= 0.5 + 0.25 * 3
    expected[4] -= 0.5 + 0.25 * 1
    np.testing.assert_array_equal(sampler.penalized(LOGITS), expected)


def test_negative_penalties_favour_repeats():
    sampler = Sampler(SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5))
    sampler.counts = {2: 2}
    assert sampler.penalized(LOGITS)[2] == LOGITS.astype(np.float64)[2] + 1.0 + 0.5 * 2


def test_greedy_with_frequency_penalty_counts_its_own_tokens():
    # Token 1 leads token 3 by log(0.4 / 0.3) = 0.288: it wins until two picks (0.4 of penalty)
    # put it behind, then token 3 wins once (0.2) and falls behind in turn.
    sampler = Sampler(SamplingParams(frequency_penalty=0.2))
    picks = [sampler.sample(LOGITS).token_id for _ in range(4)]
    scores = LOGITS.astype(np.float64)
    counts = np.zeros(5)
    expected = []
    for _ in range(4):
        token = int(np.argmax(scores - 0.2 * counts))
        counts[token] += 1
        expected.append(token)
    assert picks == expected == [1, 1, 3, 1]
    assert sampler.counts == {1: 3, 3: 1}


def test_without_penalties_no_counts_are_kept():
    sampler = Sampler(SamplingParams())
    for _ in range(3):
        sampler.sample(LOGITS)
    assert sampler.counts == {}


def test_no_logprobs_unless_asked():
    assert Sampler(SamplingParams()).sample(LOGITS).logprobs is None


def test_logprobs_are_the_raw_log_softmax_and_top_k_is_ordered():
    logits = np.array([0.5, 3.0, -1.0, 3.0, 2.0, 0.0], np.float32)  # a tie between tokens 1 and 3
    expected = numpy_log_softmax(logits)
    sample = Sampler(SamplingParams(logprobs=4)).sample(logits)
    assert sample.token_id == 1
    lp = sample.logprobs
    assert lp.token_id == 1 and lp.logprob == pytest.approx(expected[1], abs=1e-12)
    assert lp.top_ids == (1, 3, 4, 0)  # most likely first, the tie by token id
    np.testing.assert_allclose(lp.top_logprobs, expected[[1, 3, 4, 0]], atol=1e-12)


def test_logprobs_ignore_temperature_and_penalties():
    params = SamplingParams(temperature=0.7, seed=5, frequency_penalty=2.0, presence_penalty=1.0, logprobs=2)
    sampler = Sampler(params)
    expected = numpy_log_softmax(LOGITS)
    for _ in range(20):
        s = sampler.sample(LOGITS)
        assert s.logprobs.token_id == s.token_id
        assert s.logprobs.logprob == pytest.approx(expected[s.token_id], abs=1e-12)
        assert s.logprobs.top_ids == (1, 3)
    assert sum(sampler.counts.values()) == 20


def test_logprobs_zero_gives_only_the_chosen_token_and_k_is_capped_by_the_vocabulary():
    s = Sampler(SamplingParams(logprobs=0)).sample(LOGITS)
    assert s.logprobs.top_ids == () and s.logprobs.top_logprobs == ()
    assert Sampler(SamplingParams(logprobs=20)).sample(LOGITS).logprobs.top_ids == (1, 3, 4, 2, 0)


def test_a_tiny_temperature_is_greedy_not_nan():
    assert Sampler(SamplingParams(temperature=1e-320, seed=0)).sample(LOGITS).token_id == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 2.5), ("frequency_penalty", -2.01), ("logprobs", -1), ("logprobs", 21)],
)
def test_invalid_penalties_and_logprobs_are_rejected(field, value):
    with pytest.raises(RequestError, match=field):
        SamplingParams(**{field: value})


def reference_candidates(weights: np.ndarray, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """top-k then top-p by a full sort of the vocabulary (most likely first, ties by id)."""
    ids = np.lexsort((np.arange(len(weights)), -weights.astype(np.float64)))
    if top_k:
        ids = ids[:top_k]
    probs = weights[ids].astype(np.float64) / weights[ids].sum(dtype=np.float64)
    keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1 if top_p < 1.0 else len(ids)
    return ids[:keep], probs[:keep] / probs[:keep].sum()


@pytest.mark.parametrize("top_k", [0, 1, 5, 40, 3000])
@pytest.mark.parametrize("top_p", [1.0, 0.5, 0.95])
@pytest.mark.parametrize("shape", ["flat", "peaked", "ties"])
def test_candidates_equal_a_full_sort(top_k, top_p, shape):
    rng = np.random.default_rng(top_k + int(top_p * 100))
    logits = (rng.standard_normal(5000) * 2).astype(np.float32)
    if shape == "peaked":
        logits[[4321, 17]] += [30.0, 28.0]
    if shape == "ties":  # coarse values: many tokens share each weight, also at the k-th place
        logits = np.round(logits).astype(np.float32)
    weights = temperature_weights(logits, 0.8)
    got = candidates(weights, top_k, top_p)
    if not top_k and top_p == 1.0:
        assert got is None
        return
    ids, probs = got
    want_ids, want_probs = reference_candidates(weights, top_k, top_p)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(probs, want_probs, rtol=1e-9)


@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_temperature_sampling_over_many_blocks_follows_the_distribution():
    # 3000 tokens (six CDF blocks); the mass sits in tokens of different blocks, the last included.
    logits = np.full(3000, -40.0, np.float32)
    logits[[3, 700, 1536, 2999]] = np.log([0.1, 0.2, 0.3, 0.4])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11))
    counts = np.bincount([sampler.sample(logits).token_id for _ in range(20000)], minlength=3000) / 20000
    np.testing.assert_allclose(counts[[3, 700, 1536, 2999]], [0.1, 0.2, 0.3, 0.4], atol=0.015)
    assert counts.sum() == pytest.approx(counts[[3, 700, 1536, 2999]].sum())
