"""EngineCore driven by hand, as tools drive it: `step()` on the caller's thread, no engine thread.
Tokens are checked against HF transformers' greedy generation on a tiny random Gemma 3."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.core import EngineCore
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.stats import TierCounts
from wicore.errors import ContextLengthError
from wicore.types.outputs import Priority
from wicore.types.sampling import SamplingParams

RNG = np.random.default_rng(11)
PROMPTS = [RNG.integers(3, 512, int(n)).tolist() for n in (5, 23, 9, 40)]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_export):
    return tiny_export(2)


def core(model_dir, **overrides) -> EngineCore:
    scheduler = SchedulerConfig(max_num_batched_tokens=32, prefill_chunk=16)
    return EngineCore(tiny_config(model_dir, **{"num_device_blocks": 128, "scheduler": scheduler, **overrides}))


def test_stepping_by_hand_generates_what_hf_generates(tiny, reference_greedy):
    model_dir, hf_model = tiny
    c = core(model_dir)
    try:
        assert c.step() == [] and c.num_steps == 0  # nothing queued: an empty step runs nothing
        for i, prompt in enumerate(PROMPTS):
            c.add(c.make_request(prompt, GREEDY, f"r{i}"))
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
        ends = {}
        steps = 0
        while c.has_work:
            for out in c.step():
                tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    ends[out.request_id] = (out.finish_reason, out.num_prompt_tokens)
            steps += 1
        assert tokens == {f"r{i}": reference_greedy(hf_model, p, 6) for i, p in enumerate(PROMPTS)}
        assert ends == {f"r{i}": ("length", len(p)) for i, p in enumerate(PROMPTS)}
        # 77 prompt tokens at most 32 a step (prefill chunks of 16), then decodes: every step ran rows
        assert c.num_steps == steps
        stats = c.stats()
        assert (stats.running, stats.waiting, stats.generated_tokens) == (0, 0, 6 * len(PROMPTS))
        assert stats.blocks_referenced == TierCounts()
    finally:
        c.close()


def test_priority_then_fcfs_order_of_admission(tiny):
    """One running request at a time: the order in which they end is the order of admission."""
    c = core(tiny[0], scheduler=SchedulerConfig(max_num_seqs=1, aging_seconds=0))
    try:
        names = ["low", "normal-1", "urgent", "normal-2", "high"]
        priorities = [Priority.LOW, Priority.NORMAL, Priority.URGENT, Priority.NORMAL, Priority.HIGH]
        for i, (name, priority) in enumerate(zip(names, priorities)):
            c.add(c.make_request([5, 6, 7 + i], GREEDY, name, priority))
        ended = [out.request_id for out in c.run_to_end() if out.finished]
        assert ended == ["urgent", "high", "normal-1", "normal-2", "low"]
    finally:
        c.close()


def test_abort_ends_a_request_at_the_next_step_and_frees_its_blocks(tiny):
    c = core(tiny[0])
    try:
        c.add(c.make_request(PROMPTS[3], SamplingParams(max_tokens=50, ignore_eos=True), "long"))
        c.add(c.make_request(PROMPTS[0], GREEDY, "short"))
        first = c.step()  # prefill chunks
        assert all(not o.finished for o in first)
        c.abort("long")
        c.abort("nobody")  # unknown ids are ignored
        outputs = c.step()
        assert [(o.request_id, o.finish_reason) for o in outputs if o.finished] == [("long", "abort")]
        rest = c.run_to_end()
        assert [(o.request_id, o.finish_reason) for o in rest if o.finished] == [("short", "length")]
        assert c.stats().blocks_referenced == TierCounts() and not c.has_request("long")
    finally:
        c.close()


def test_make_request_checks_without_queueing(tiny):
    """`make_request` is the admission check: a prompt with no room raises and nothing is queued."""
    c = core(tiny[0], num_device_blocks=5)  # 4 usable blocks of 4 tokens: 16 tokens a sequence
    try:
        with pytest.raises(ContextLengthError, match="the prompt has 16 tokens"):
            c.make_request(list(range(3, 19)), GREEDY, "long")
        request = c.make_request(list(range(3, 15)), SamplingParams(max_tokens=10), "capped")
        assert request.max_tokens == 4 and not c.has_work  # capped by the room left; not queued
    finally:
        c.close()
