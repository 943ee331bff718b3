"""logit_bias, min_p and repetition_penalty in the host sampler, against hand-computed values
and HF transformers' MinPLogitsWarper and RepetitionPenaltyLogitsProcessor."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.errors import RequestError
from wicore.executor.sampler import Sampler
from wicore.types.sampling import SamplingParams

LOGITS = np.array([1.0, 3.0, -2.0, 0.5, 2.5, -0.5], np.float32)  # argmax: token 1


def test_a_bias_of_minus_100_removes_the_token_and_plus_100_forces_one():
    banned = Sampler(SamplingParams(logit_bias=((1, -100.0),)))
    assert banned.sample(LOGITS).token_id == 4  # the runner-up
    forced = Sampler(SamplingParams(logit_bias=((2, 100.0),)))
    assert forced.sample(LOGITS).token_id == 2
    sampled = Sampler(SamplingParams(temperature=1.0, seed=0, logit_bias=((1, -100.0), (4, -100.0))))
    assert 1 not in {sampled.sample(LOGITS).token_id for _ in range(500)}


def test_the_bias_adds_to_the_logits_and_logprobs_stay_raw():
    sampler = Sampler(SamplingParams(logit_bias=((0, 2.5), (3, -1.0)), logprobs=1))
    np.testing.assert_array_equal(sampler.penalized(LOGITS), LOGITS.astype(np.float64) + [2.5, 0, 0, -1.0, 0, 0])
    sample = sampler.sample(LOGITS)  # 1 + 2.5 = 3.5 beats 3.0
    assert sample.token_id == 0
    shifted = LOGITS.astype(np.float64) - LOGITS.max()
    assert sample.logprobs is not None
    assert sample.logprobs.logprob == pytest.approx(shifted[0] - np.log(np.exp(shifted).sum()))  # vLLM's raw logprobs


def test_repetition_penalty_is_hfs_over_the_prompt_and_the_output():
    torch = pytest.importorskip("torch")
    from transformers import RepetitionPenaltyLogitsProcessor

    prompt = [1, 2, 2]
    sampler = Sampler(SamplingParams(repetition_penalty=1.7, temperature=1.0, seed=0), prompt)
    output = [sampler.sample(LOGITS).token_id for _ in range(3)]
    seen = torch.tensor([prompt + output])
    expected = RepetitionPenaltyLogitsProcessor(1.7)(seen, torch.tensor(LOGITS[None], dtype=torch.float64))[0].numpy()
    np.testing.assert_allclose(sampler.penalized(LOGITS), expected, rtol=1e-12)


def test_repetition_penalty_by_hand_divides_positive_and_multiplies_negative_logits():
    sampler = Sampler(SamplingParams(repetition_penalty=2.0), prompt_ids=[1, 2])
    np.testing.assert_array_equal(sampler.penalized(LOGITS), [1.0, 1.5, -4.0, 0.5, 2.5, -0.5])
    assert sampler.sample(LOGITS).token_id == 4  # 2.5 now beats token 1's 1.5
    assert sampler.penalized(LOGITS)[4] == 1.25  # and is seen from then on


def test_bias_comes_before_the_repetition_penalty_as_in_vllm():
    sampler = Sampler(SamplingParams(repetition_penalty=2.0, logit_bias=((2, 4.0),)), prompt_ids=[2])
    assert sampler.penalized(LOGITS)[2] == 1.0  # (-2 + 4) / 2, not -2 * 2 + 4


@pytest.mark.parametrize(("min_p", "temperature"), [(0.1, 1.0), (0.3, 1.0), (0.3, 0.5), (0.05, 2.0)])
def test_min_p_keeps_what_hfs_min_p_warper_keeps(min_p, temperature):
    torch = pytest.importorskip("torch")
    from transformers import MinPLogitsWarper

    tempered = torch.tensor(LOGITS[None] / temperature)
    kept = set(np.flatnonzero(np.isfinite(MinPLogitsWarper(min_p)(None, tempered)[0].numpy())).tolist())
    sampler = Sampler(SamplingParams(temperature=temperature, min_p=min_p, seed=1))
    drawn = {sampler.sample(LOGITS).token_id for _ in range(4000)}
    assert drawn == kept


def test_min_p_by_hand():
    # probabilities at T=1: token 1 is the likeliest; min_p 0.5 keeps p >= 0.5 p_max: logit >= 3 - ln 2 = 2.31
    sampler = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=0))
    assert {sampler.sample(LOGITS).token_id for _ in range(2000)} == {1, 4}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_p", 1.5, "min_p"),
        ("min_p", -0.1, "min_p"),
        ("repetition_penalty", 0.0, "repetition_penalty"),
        ("logit_bias", ((1, 101.0),), "logit_bias"),
        ("logit_bias", ((-1, 1.0),), "logit_bias"),
    ],
)
def test_invalid_knobs_are_refused(field, value, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**{field: value})
