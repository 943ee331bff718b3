"""The sampling head under grammar masks (wicore.graph.sampling, `sampling_token_bitmask`): the
CPU EP runs the same head graph as the GPU, so these pin the mask's exactness against the host
sampler (wicore.executor.sampler): the same greedy token, the same inverse-CDF draw for the same
uniform, and seeded draws that follow the masked distribution."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from test_sampler_structured import ALLOWED, LOGITS, MASK, assert_follows, packed, renormalised

from wicore.executor.sampler import Sampler, _inverse_cdf, temperature_weights
from wicore.graph import io
from wicore.graph.sampling import TOP_CANDIDATES, head_model
from wicore.structured.bitmask import allowed, num_words
from wicore.types.sampling import SamplingParams


def head_session(vocab: int, token_bitmask: bool = True) -> ort.InferenceSession:
    return ort.InferenceSession(head_model(vocab, token_bitmask).SerializeToString(), providers=["CPUExecutionProvider"])


def run_head(logits: np.ndarray, masks: np.ndarray, temperature: np.ndarray, uniform: np.ndarray) -> list[np.ndarray]:
    feeds = {
        io.LOGITS: logits,
        io.SAMPLING_TEMPERATURE: temperature,
        io.SAMPLING_UNIFORM: uniform,
        io.SAMPLING_TOKEN_BITMASK: masks,
    }
    return head_session(logits.shape[1]).run([io.SAMPLED_TOKENS, io.TOP_PROBS, io.TOP_IDS], feeds)


def random_masks(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Masks of every density: one allowed token, a few, half, all but one, all (a free row)."""
    out = []
    for r in range(rows):
        keep = np.zeros(vocab, bool)
        kind = r % 5
        if kind == 0:
            keep[rng.integers(vocab)] = True
        elif kind == 1:
            keep[rng.choice(vocab, min(vocab, 7), replace=False)] = True
        elif kind == 2:
            keep = rng.random(vocab) < 0.5
            keep[rng.integers(vocab)] = True
        elif kind == 3:
            keep[:] = True
            keep[rng.integers(vocab)] = False
        else:
            keep[:] = True
        out.append(packed(keep))
    return np.stack(out)


@pytest.mark.parametrize("vocab", [pytest.param(262_208, marks=pytest.mark.slow), 1_000, 40])  # Gemma 3's: 2 s
def test_the_masked_head_picks_and_draws_the_host_samplers_tokens(vocab):
    """Greedy: the head's best candidate is the host's masked argmax; tempered: its draw is the
    host's for the same uniform; its candidates are the masked distribution's, refused ones at 0."""
    rng = np.random.default_rng(vocab)
    rows = 20
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    masks = random_masks(rng, rows, vocab)
    assert masks.shape == (rows, num_words(vocab))
    temperature = rng.uniform(0.2, 2.0, rows).astype(np.float32)
    uniform = rng.random(rows).astype(np.float32)
    tokens, probs, ids = run_head(logits, masks, temperature, uniform)
    k = min(TOP_CANDIDATES, vocab)
    for r in range(rows):
        keep = allowed(masks[r], vocab)
        assert ids[r, 0] == Sampler(SamplingParams()).sample(logits[r], masks[r]).token_id
        weights = temperature_weights(np.where(keep, logits[r], -np.inf), float(temperature[r]))
        assert tokens[r] == _inverse_cdf(weights, float(uniform[r]))
        assert keep[tokens[r]]
        expected = weights.astype(np.float64) / weights.sum(dtype=np.float64)
        order = np.lexsort((np.arange(vocab), -expected))[:k]
        held = min(k, int(keep.sum()))  # past the allowed tokens the candidates are refused ones at 0
        assert ids[r, :held].tolist() == order[:held].tolist()
        np.testing.assert_allclose(probs[r], expected[ids[r]], rtol=2e-4, atol=1e-9)
        assert (probs[r, held:] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_seeded_head_draws_follow_the_masked_distribution(temperature):
    """6000 rows of the same logits and mask, each with its own seeded uniform: the tokens follow
    the model's distribution renormalised over the allowed tokens, none refused."""
    n = 6000
    sampler = Sampler(SamplingParams(temperature=temperature, seed=11))
    uniform = np.array([sampler.uniform() for _ in range(n)], np.float32)
    logits = np.broadcast_to(LOGITS, (n, len(LOGITS))).copy()
    masks = np.broadcast_to(MASK, (n, len(MASK))).copy()
    tokens, _, _ = run_head(logits, masks, np.full(n, temperature, np.float32), uniform)
    assert_follows(tokens, renormalised(LOGITS, ALLOWED, temperature))


def test_top_k_top_p_picks_from_the_masked_candidates_follow_the_cut_distribution():
    """A top-k / top-p row picks on the host from the head's masked candidates: the cut of the
    masked distribution, as the host sampler cuts it (tests/executor/test_sampler_structured.py)."""
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.9, seed=5)
    _, probs, ids = run_head(LOGITS[None], MASK[None], np.full(1, 0.8, np.float32), np.zeros(1, np.float32))
    head, host = Sampler(params), Sampler(params)
    for _ in range(300):
        assert head.from_candidates(probs[0], ids[0]) == host.sample(LOGITS, MASK).token_id


def test_a_head_built_without_the_mask_input_says_so():
    """The engine reads the head's inputs to decide where constrained rows sample (an older build's
    head has no mask input: they sample on the host)."""
    with_masks, without = head_session(300), head_session(300, token_bitmask=False)
    assert io.SAMPLING_TOKEN_BITMASK in {i.name for i in with_masks.get_inputs()}
    assert io.SAMPLING_TOKEN_BITMASK not in {i.name for i in without.get_inputs()}
