"""Speculative decoding on the real Gemma 3 270M: the greedy text is the one plain decoding gives,
for prompts that ask to repeat a text (prompt lookup finds drafts), ordinary ones, one past the
512-token sliding window, and under preemption."""

from __future__ import annotations

import pytest

from wicore.cli.verify import VERIFY_TEXT
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)
NGRAM = SpeculativeConfig("ngram", num_speculative_tokens=5)


def prompts(tok) -> list[list[int]]:
    long_text = " ".join([VERIFY_TEXT] * 14)
    texts = [
        f"Copy this sentence exactly.\nSentence: {VERIFY_TEXT}\nCopy: {VERIFY_TEXT[:40]}",
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef fib",
        long_text,  # past the sliding window
    ]
    ids = [tok.encode(t) for t in texts]
    assert len(ids[-1]) > 560
    return ids


def run(folder, spec, repeat: int = 1, **overrides) -> tuple[list[list[int]], dict]:
    config = EngineConfig(model_dir=folder, num_threads=2, verify_files=False, speculative=spec, **overrides)
    with Engine(config) as engine:
        completions = engine.generate(prompts(engine.tokenizer) * repeat, PARAMS)
        stats = engine.stats()
    assert all(c.error is None for c in completions)
    return [c.token_ids for c in completions], stats


@pytest.fixture(scope="module")
def plain(gemma_270m):
    return run(gemma_270m(3), None)[0]


def test_ngram_speculation_gives_the_same_greedy_text(gemma_270m, plain):
    outputs, stats = run(gemma_270m(3), NGRAM)
    assert outputs == plain
    assert stats.speculative.num_accepted_tokens > 0


def test_ngram_speculation_under_preemption_gives_the_same_greedy_text(gemma_270m, plain):
    """Each prompt twice: the two long ones (69 blocks of 16 tokens each) cannot both be on the device (79 blocks)."""
    tight = dict(num_device_blocks=80, host_tier_gb=0.25, scheduler=SchedulerConfig(max_num_batched_tokens=128))
    outputs, stats = run(gemma_270m(3), NGRAM, repeat=2, **tight)
    assert outputs == plain * 2
    assert stats.preempted_swap + stats.preempted_recompute > 0
    assert stats.speculative.num_accepted_tokens > 0


def test_a_draft_model_gives_the_same_greedy_text(gemma_270m, plain):
    """The 270M drafting for itself (every draft kept): the draft engine's prefix-cached proposals
    over the same prompts, the long one included. (Rejections on a real pair: tools/bench_speculative.py,
    the ort-quant 270M drafting for the fp32 one; on a tiny pair: tests/engine/test_speculative.py.)"""
    folder = gemma_270m(3)
    outputs, stats = run(folder, SpeculativeConfig("draft", num_speculative_tokens=4, draft_model_dir=folder))
    assert outputs == plain
    s = stats.speculative
    assert s.num_drafts > 0 and s.num_accepted_tokens == s.num_draft_tokens
