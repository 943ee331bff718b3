"""Host-side sampling: exact choices on small hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.errors import RequestError
from wicore.runtime.sampler import Sampler, SamplingParams

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], np.float32))  # probs by token id


def draws(params: SamplingParams, n: int = 2000) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler(LOGITS) for _ in range(n)])


def test_greedy_takes_the_argmax_and_the_first_of_ties():
    assert Sampler(SamplingParams())(LOGITS) == 1
    assert Sampler(SamplingParams())(np.array([0.0, 2.0, 2.0], np.float32)) == 1


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
    [("max_tokens", 0, "max_tokens"), ("temperature", -1.0, "temperature"), ("top_k", -2, "top_k"), ("top_p", 0.0, "top_p"),
     ("seed", -1, "seed")],
)
def test_invalid_params_are_rejected(field, value, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**{field: value})
