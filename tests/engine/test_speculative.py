"""Speculative decoding (wicore.engine.speculative): n-gram drafts, verification rows, rollback,
and speculative sampling keeping the sampler's distribution."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.blocks.tier import Tier
from wicore.engine.engine import Engine
from wicore.engine.proposers import ngram_lookup
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig
from wicore.errors import ManifestError
from wicore.types.sampling import SamplingParams

RNG = np.random.default_rng(3)
# Prompts that repeat themselves, so that prompt lookup finds drafts (some right, some wrong).
PROMPTS = [(RNG.integers(3, 512, int(n)).tolist() * 3)[: int(m)] for n, m in zip(RNG.integers(4, 12, 8), RNG.integers(10, 40, 8))]
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
NGRAM4 = SpeculativeConfig("ngram", num_speculative_tokens=4)


def test_ngram_lookup_continues_the_latest_earlier_occurrence():
    assert ngram_lookup([5, 1, 2, 3, 9, 4, 1, 2, 3], 3, 3, 1) == [9, 4, 1]
    assert ngram_lookup([1, 2, 7, 1, 2, 8, 1, 2], 2, 2, 1) == [8, 1]  # the most recent of two occurrences
    assert ngram_lookup([1, 2, 3, 4], 3, 3, 1) == []  # no earlier occurrence of any suffix
    assert ngram_lookup([4, 6, 9, 4], 5, 3, 1) == [6, 9, 4]  # n = 1, and the draft may reach the end
    assert ngram_lookup([7, 7, 7], 2, 2, 1) == [7]  # the suffix 7 7 occurs at 0, followed by the last 7
    assert ngram_lookup([1, 2, 1, 2], 0, 2, 1) == []


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        SpeculativeConfig("ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="choose ngram or draft"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match="draft method only"):
        SpeculativeConfig("ngram", draft_model_dir="x")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model_dir(tiny_export):
    return tiny_export(1)[0]


def engine(model_dir, spec: SpeculativeConfig | None, **overrides) -> Engine:
    scheduler = SchedulerConfig(max_num_batched_tokens=64, prefill_chunk=16)
    settings = dict(verify_files=False, scheduler=scheduler, speculative=spec)
    return Engine(tiny_config(model_dir, **{**settings, **overrides}))


def generate(model_dir, spec, prompts=PROMPTS, params=GREEDY, **overrides):
    with engine(model_dir, spec, **overrides) as eng:
        completions = eng.generate(prompts, params)
        stats = eng.stats()
        pools = [g.pool for g in eng.core.kv.groups]
        free = [(p.num_free(Tier.DEVICE), p.num_evictable(Tier.DEVICE), sum(b.ref_count for b in p.blocks())) for p in pools]
    return completions, stats, free


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_text_is_the_same_with_ngram_speculation(model_dir, k):
    plain, _, _ = generate(model_dir, None)
    spec, stats, _ = generate(model_dir, SpeculativeConfig("ngram", num_speculative_tokens=k))
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    s = stats.speculative
    assert s.num_drafts > 0 and s.num_draft_tokens >= s.num_drafts
    assert 0 < s.num_accepted_tokens <= s.num_draft_tokens
    # every generated token is counted once, whether it came from a plain or a verification row
    assert stats.generated_tokens == sum(len(c.token_ids) for c in spec)


def test_rejected_drafts_leave_no_blocks_and_no_prefix_hashes_behind(model_dir):
    """After the requests end, the pool holds exactly what plain decoding leaves: the same
    cached (hashed) blocks, nothing owned."""
    _, _, plain_free = generate(model_dir, None)
    _, stats, spec_free = generate(model_dir, SpeculativeConfig("ngram", num_speculative_tokens=5))
    assert stats.speculative.num_accepted_tokens < stats.speculative.num_draft_tokens  # some were rolled back
    assert spec_free == plain_free
    assert all(num_referenced == 0 for _, _, num_referenced in spec_free)


def test_greedy_text_is_the_same_under_preemption_and_stops(model_dir, tiny_export):
    params = [
        SamplingParams(max_tokens=n, ignore_eos=True, stop_token_ids=(5,) if i % 3 == 0 else ())
        for i, n in enumerate(RNG.integers(1, 20, len(PROMPTS)).tolist())
    ]
    tight = dict(num_device_blocks=24, num_host_blocks=16, scheduler=SchedulerConfig(max_num_batched_tokens=32, prefill_chunk=8))
    plain, _, _ = generate(model_dir, None, params=params)
    draft = SpeculativeConfig("draft", num_speculative_tokens=3, draft_model_dir=tiny_export(1, seed=1)[0])
    for preemption, config in (("swap", NGRAM4), ("recompute", NGRAM4), ("swap", draft), ("recompute", draft)):
        sched = SchedulerConfig(max_num_batched_tokens=32, prefill_chunk=8, preemption=preemption)
        spec, stats, _ = generate(model_dir, config, params=params, **{**tight, "scheduler": sched})
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
        assert [c.finish_reason for c in spec] == [c.finish_reason for c in plain]
        assert stats.preempted_swap + stats.preempted_recompute > 0
        assert stats.speculative.num_drafts > 0


def test_a_request_can_opt_out(model_dir):
    params = SamplingParams(max_tokens=16, ignore_eos=True, speculative=False)
    _, stats, _ = generate(model_dir, SpeculativeConfig("ngram"), params=params)
    assert stats.speculative.num_drafts == 0


def test_logprobs_come_for_every_token_of_a_verification_row(model_dir):
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2)
    with engine(model_dir, None) as eng:
        plain = (
            [[lp for out in eng.outputs(eng.add_request(p, params)) for lp in out.logprobs or []] for p in PROMPTS[:1]]
            if eng.start()
            else []
        )
    with engine(model_dir, SpeculativeConfig("ngram")) as eng:
        spec = (
            [[lp for out in eng.outputs(eng.add_request(p, params)) for lp in out.logprobs or []] for p in PROMPTS[:1]]
            if eng.start()
            else []
        )
        assert eng.stats().speculative.num_accepted_tokens > 0
    assert [[lp.token_id for lp in r] for r in spec] == [[lp.token_id for lp in r] for r in plain]
    for a, b in zip(spec[0], plain[0]):
        assert a.top_ids == b.top_ids
        np.testing.assert_allclose(a.logprob, b.logprob, atol=1e-4)


def test_a_draft_model_gives_the_same_greedy_text(model_dir, tiny_export):
    """The target drafting for itself keeps every draft; another random model (same vocabulary)
    keeps few, and the text is the same either way."""
    plain, _, _ = generate(model_dir, None)
    other = tiny_export(1, seed=1)[0]
    for draft_dir, all_kept in ((model_dir, True), (other, False)):
        spec, stats, _ = generate(model_dir, SpeculativeConfig("draft", num_speculative_tokens=3, draft_model_dir=draft_dir))
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
        s = stats.speculative
        assert s.num_drafts > 0
        assert (s.num_accepted_tokens == s.num_draft_tokens) is all_kept


def test_a_draft_model_with_another_vocabulary_is_refused(model_dir, tiny_export):
    other = tiny_export(1, vocab_size=256)[0]
    with pytest.raises(ManifestError, match="vocabulary of 256 tokens, the target 512"):
        engine(model_dir, SpeculativeConfig("draft", draft_model_dir=other))


def test_seeded_sampling_with_speculation_repeats(model_dir):
    params = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, top_k=3, seed=i) for i in range(len(PROMPTS))]
    first, stats, _ = generate(model_dir, SpeculativeConfig("ngram", num_speculative_tokens=4), params=params)
    again, _, _ = generate(model_dir, SpeculativeConfig("ngram", num_speculative_tokens=4), params=params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert all(c.error is None and len(c.token_ids) == 16 for c in first)
    assert stats.speculative.num_accepted_tokens > 0


def test_abort_and_deadline_end_speculating_requests_and_free_their_blocks(model_dir):
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    with engine(model_dir, SpeculativeConfig("ngram")).start() as eng:
        aborted = eng.add_request(PROMPTS[0], params)
        expiring = eng.add_request(PROMPTS[1], params, deadline=0.05)
        outputs = eng.outputs(aborted)
        first = next(iter(outputs))  # generating (and speculating) by now
        eng.abort(aborted)
        ends = [first, *outputs]
        late = list(eng.outputs(expiring))
        assert ends[-1].finish_reason == "abort" and late[-1].finish_reason == "deadline"
        eng.generate([PROMPTS[2]], GREEDY)  # one more step after both ended
        assert eng.stats().blocks_referenced.device == 0


class Proposes:
    """A proposer that always drafts `[1, 2, 3]` (cut to what is asked)."""

    def propose(self, sequences, num_tokens):
        return {r: [1, 2, 3][: num_tokens[r]] for r in sequences}

    def close(self) -> None:
        pass


def fake_request(request_id: str, num_output: int = 0, max_tokens: int = 100, speculative: bool = True):
    from wicore.engine.request import Request
    from wicore.types.outputs import Priority

    params = SamplingParams(max_tokens=max_tokens, speculative=speculative)
    req = Request(request_id, [9, 9, 9], params, max_tokens, Priority.NORMAL, 0.0)
    req.token_ids += [4] * num_output
    return req


def observe(spec, request_id: str, num_draft: int, num_kept: int) -> None:
    """`spec` sees one verification row of `request_id` that kept `num_kept` of `num_draft` drafts."""
    from wicore.types.sampling import Sample
    from wicore.types.step import RunResult, ScheduledRow

    row = ScheduledRow(
        request_id, [0] * (num_draft + 1), 0, [], [], [], 0, num_draft + 1, True, GREEDY, draft_ids=(1,) * num_draft
    )
    spec.observe([row], RunResult(verified={request_id: [Sample(1)] * (num_kept + 1)}))


def test_speculator_backs_off_on_low_acceptance_and_large_batches():
    from wicore.engine.speculative import Speculator

    spec = Speculator(
        SpeculativeConfig("ngram", num_speculative_tokens=3, max_batch=2, min_acceptance=0.5, backoff_steps=3), Proposes()
    )
    a, b, c = fake_request("a"), fake_request("b", num_output=98), fake_request("c", speculative=False)
    # b may generate 2 more tokens: a draft of 1 (kept, plus the row's own token); c opted out
    assert spec.drafts([a, b]) == {"a": [1, 2, 3], "b": [1]}
    assert spec.drafts([a, c]) == {"a": [1, 2, 3]}
    assert spec.drafts([a, b, c]) == {}  # more than max_batch decoding: none speculates
    observe(spec, "a", 3, 3)
    observe(spec, "a", 3, 0)  # moving rate 0.5 * 1 + 0.5 * 0 = 0.5: goes on
    assert spec.drafts([a]) == {"a": [1, 2, 3]}
    observe(spec, "a", 3, 0)  # 0.25 < 0.5: no drafts for 3 steps
    assert [spec.drafts([a]) for _ in range(4)] == [{}, {}, {}, {"a": [1, 2, 3]}]
    assert spec.stats.as_dict() == {
        "num_drafts": 3,
        "num_draft_tokens": 9,
        "num_accepted_tokens": 3,
        "acceptance_rate": 1 / 3,
        "mean_acceptance_length": 2.0,
        "accepted_per_position": [1, 1, 1],
    }


def test_penalties_apply_token_by_token_inside_a_verification_row(model_dir):
    params = SamplingParams(max_tokens=16, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.5)
    plain, _, _ = generate(model_dir, None, params=params)
    spec, stats, _ = generate(model_dir, SpeculativeConfig("ngram", num_speculative_tokens=4), params=params)
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    assert stats.speculative.num_drafts > 0  # (penalties steer away from repeats: few drafts are kept)
