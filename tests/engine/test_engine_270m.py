"""The engine on the real Gemma 3 270M: concurrency and preemption change nothing in the output."""

from __future__ import annotations

import time

import numpy as np
import pytest

from wicore.cli.verify import VERIFY_TEXT
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def workload(gemma_270m):
    """32 prompts of mixed lengths (4 past the 512-token sliding window), their outputs alone
    (one request at a time, no prefix cache: each computes its whole prompt), the tokenizer."""
    folder = gemma_270m(3)
    config = EngineConfig(model_dir=folder, num_threads=2, verify_files=False, host_tier_gb=0, enable_prefix_cache=False)
    with Engine(config) as engine:
        tok = engine.tokenizer
        words = (" ".join([VERIFY_TEXT] * 12)).split()
        rng = np.random.default_rng(0)
        lengths = [int(n) for n in rng.integers(4, 120, 28)] + [530, 560, 600, 700]
        prompts = [tok.encode(" ".join(words[i % 40 : i % 40 + n])) for i, n in enumerate(lengths)]
        alone = []
        for p in prompts:
            (completion,) = engine.generate([p], PARAMS)
            assert completion.error is None and completion.finish_reason == "length"
            alone.append(completion.token_ids)
    return folder, prompts, alone, tok


def run(engine: Engine, prompts: list[list[int]], stagger: float) -> list[list[int]]:
    ids = []
    for p in prompts:
        ids.append(engine.add_request(p, PARAMS))
        time.sleep(stagger)
    return [[t for out in engine.outputs(i) for t in out.new_token_ids] for i in ids]


def test_32_concurrent_requests_arriving_over_time_match_alone(workload):
    folder, prompts, alone, _ = workload
    with Engine(EngineConfig(model_dir=folder, num_threads=2, verify_files=False)).start() as engine:
        assert run(engine, prompts, stagger=0.05) == alone
        stats = engine.stats()
    assert stats.generated_tokens == 32 * 12


def test_tier0_too_small_swaps_and_still_matches(workload, tmp_path):
    folder, prompts, alone, _ = workload
    config = EngineConfig(
        model_dir=folder,
        num_threads=2,
        verify_files=False,
        num_device_blocks=120,
        num_host_blocks=40,
        num_nvme_blocks=400,
        nvme_dir=tmp_path,
        scheduler=SchedulerConfig(max_num_batched_tokens=256),
    )
    with Engine(config) as engine:
        ids = [engine.add_request(p, PARAMS) for p in prompts]
        engine.start()
        outputs = [[t for out in engine.outputs(i) for t in out.new_token_ids] for i in ids]
        stats = engine.stats()
    assert outputs == alone
    assert stats.preempted_swap > 0


def test_a_shared_1024_token_prefix_past_the_window_is_prefilled_once(workload):
    """The second prompt reuses the first one's 64 full blocks (1,024 tokens): the full
    layers' blocks 0-63 and the sliding layers' blocks 32-63 (what position 1,024 still sees
    through the 512-token window; the first request released the rest and kept them cached)."""
    folder, prompts, _, tok = workload
    words = (" ".join([VERIFY_TEXT] * 40)).split()
    prefix = tok.encode(" ".join(words))[:1024]
    first, second = prefix + prompts[0][1:], prefix + prompts[1][1:]  # suffixes without their BOS
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    def outputs(enable_prefix_cache: bool) -> tuple[list[list[int]], list[int]]:
        config = EngineConfig(model_dir=folder, num_threads=2, verify_files=False, enable_prefix_cache=enable_prefix_cache)
        results, computed = [], []
        with Engine(config).start() as engine:
            for prompt in (first, second):
                before = engine.stats().computed_prompt_tokens
                request_id = engine.add_request(prompt, params)
                results.append([t for out in engine.outputs(request_id) for t in out.new_token_ids])
                computed.append(engine.stats().computed_prompt_tokens - before)
        return results, computed

    cached, computed = outputs(True)
    uncached, computed_off = outputs(False)
    assert cached == uncached
    assert computed == [len(first), len(second) - 1024]
    assert computed_off == [len(first), len(second)]


def test_questions_over_a_1500_token_document_compute_only_their_own_tokens(workload):
    """Two questions after one 1,500-token document (93 full blocks and 12 tokens). The second
    reuses 93 blocks (1,488 tokens) in both block groups: the full layers' blocks 0-92 and the
    sliding layers' blocks 61-92 (what position 1,488 sees through the 512-token window: the
    first request released blocks 0-60 of that group as its chunks moved on, and kept them
    cached). It computes only the document's last 12 tokens and its own question, its usage
    reports the 1,488 cached tokens, and its greedy tokens equal a run without the prefix cache.
    (3,000 tokens and more: tools/bench_shared_document.py, docs/PERFORMANCE.md.)"""
    folder, _, _, tok = workload
    words = (" ".join([VERIFY_TEXT] * 30)).split()
    document = tok.encode(" ".join(words))[:1500]
    questions = [tok.encode(f"\n\nQuestion {q}: what did the printing press change? Answer:", add_bos=False) for q in "AB"]
    prompts = [document + q for q in questions]
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    def outputs(enable_prefix_cache: bool) -> tuple[list[list[int]], list[int], list[int]]:
        config = EngineConfig(model_dir=folder, num_threads=2, verify_files=False, enable_prefix_cache=enable_prefix_cache)
        results, cached, computed = [], [], []
        with Engine(config).start() as engine:
            for prompt in prompts:
                before = engine.stats().computed_prompt_tokens
                outs = list(engine.outputs(engine.add_request(prompt, params)))
                results.append([t for out in outs for t in out.new_token_ids])
                cached.append(outs[-1].num_cached_tokens)
                computed.append(engine.stats().computed_prompt_tokens - before)
        return results, cached, computed

    with_cache, cached, computed = outputs(True)
    without_cache, cached_off, computed_off = outputs(False)
    assert with_cache == without_cache
    assert len(document) == 1500
    assert cached == [0, 1488]
    assert computed == [len(prompts[0]), len(prompts[1]) - 1488]
    assert cached_off == [0, 0]
    assert computed_off == [len(prompts[0]), len(prompts[1])]
