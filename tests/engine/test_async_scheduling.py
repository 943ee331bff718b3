"""Async scheduling (wicore.engine.lookahead) on the tiny chat model: a mixed workload driven by hand
gives exactly the tokens it gives without, no request sends anything after its final output, and
every block comes back to the pool."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.core import EngineCore
from wicore.engine.engine import Engine
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig
from wicore.engine.stats import TierCounts
from wicore.structured.spec import StructuredKind, StructuredOutput
from wicore.types.sampling import SamplingParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
JSON = StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "guided_json")
RNG = np.random.default_rng(5)
PROMPTS = [RNG.integers(3, 200, int(n)).tolist() for n in (4, 9, 17, 6, 11, 7, 13, 5, 60)]


@dataclass(frozen=True)
class Arrival:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    at_call: int  # added before this call of step()
    abort_after: int | None = None  # aborted once this many of its tokens came back
    stop_text: str | None = None  # aborted once its text holds this (a stop string, as the API cuts it)


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    ends: dict[str, str | None] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)  # outputs that came after their request's final one
    blocks_free_before: TierCounts = field(default_factory=TierCounts)
    blocks_free_after: TierCounts = field(default_factory=TierCounts)
    blocks_referenced_after: TierCounts = field(default_factory=TierCounts)
    num_planned_rows: int = 0  # rows planned while the step before ran
    num_steps: int = 0
    num_preempted: int = 0


def workload(stop_token: int, stop_text: str) -> list[Arrival]:
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    return [
        Arrival("greedy-a", PROMPTS[0], greedy, 0),
        Arrival("seeded-a", PROMPTS[1], SamplingParams(max_tokens=10, temperature=0.9, seed=1, ignore_eos=True), 0),
        Arrival("top-k", PROMPTS[2], SamplingParams(max_tokens=9, temperature=1.0, top_k=20, seed=2, ignore_eos=True), 1),
        Arrival("stop-token", PROMPTS[3], SamplingParams(max_tokens=16, stop_token_ids=(stop_token,), ignore_eos=True), 1),
        Arrival("aborted", PROMPTS[4], SamplingParams(max_tokens=30, ignore_eos=True), 2, abort_after=5),
        Arrival("stop-text", PROMPTS[5], SamplingParams(max_tokens=30, ignore_eos=True), 2, stop_text=stop_text),
        Arrival("json", PROMPTS[6], SamplingParams(max_tokens=24, structured=JSON), 3),
        Arrival("penalty", PROMPTS[7], SamplingParams(max_tokens=8, repetition_penalty=1.3, ignore_eos=True), 3),
        Arrival("long-prompt", PROMPTS[8], SamplingParams(max_tokens=6, temperature=0.7, seed=3, ignore_eos=True), 4),
        Arrival("eos", PROMPTS[1], SamplingParams(max_tokens=40), 6),  # ends at the model's EOS, or at max_tokens
        Arrival("one-token", PROMPTS[0], SamplingParams(max_tokens=1), 7),
    ]


def make_core(model_dir, async_scheduling: bool, **overrides) -> EngineCore:
    scheduler = SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16, prefill_with_decodes=16)
    return EngineCore(
        tiny_config(model_dir, scheduler=scheduler, verify_files=False, async_scheduling=async_scheduling, **overrides)
    )


def drive(model_dir, async_scheduling: bool, arrivals: list[Arrival], **overrides) -> Run:
    core = make_core(model_dir, async_scheduling, **overrides)
    run = Run(blocks_free_before=core.stats().blocks_free)
    tok = core.need_tokenizer()
    try:
        by_id = {a.request_id: a for a in arrivals}
        aborted: set[str] = set()
        call = 0
        while call <= max(a.at_call for a in arrivals) or core.has_work:
            for a in arrivals:
                if a.at_call == call:
                    core.add(core.make_request(a.prompt, a.params, a.request_id))
                    run.tokens[a.request_id] = []
            for out in core.step():
                if out.request_id in run.ends:
                    run.late.append(out.request_id)
                run.tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    run.ends[out.request_id] = out.finish_reason
                    continue
                a = by_id[out.request_id]
                text = tok.decode(run.tokens[a.request_id])
                hit_stop = a.stop_text is not None and a.stop_text in text
                if a.request_id not in aborted and (hit_stop or (a.abort_after or 1e9) <= len(run.tokens[a.request_id])):
                    core.abort(a.request_id)
                    aborted.add(a.request_id)
            call += 1
        stats = core.stats()
        run.blocks_free_after, run.blocks_referenced_after = stats.blocks_free, stats.blocks_referenced
        run.num_planned_rows, run.num_steps = core.scheduler.stats.num_planned_rows, core.num_steps
        run.num_preempted = stats.preempted_recompute + stats.preempted_swap
    finally:
        core.close()
    return run


@pytest.fixture(scope="module")
def chat(tiny_chat):
    return tiny_chat[0]


@pytest.fixture(scope="module")
def mixed(chat) -> list[Arrival]:
    """The workload, its stop token and stop string taken from a first run's text (random weights)."""
    probe = drive(chat, False, [Arrival("probe", PROMPTS[3], SamplingParams(max_tokens=8, ignore_eos=True), 0)])
    tokens = probe.tokens["probe"]
    stop_probe = drive(chat, False, [Arrival("probe", PROMPTS[5], SamplingParams(max_tokens=8, ignore_eos=True), 0)])
    text = make_core(chat, False).need_tokenizer().decode(stop_probe.tokens["probe"][3:5])
    assert text.strip(), "the stop string must be visible text"
    return workload(tokens[3], text)


def test_async_scheduling_gives_the_same_tokens_and_frees_every_block(chat, mixed):
    plain = drive(chat, False, mixed, enable_prefix_cache=False)
    ahead = drive(chat, True, mixed, enable_prefix_cache=False)
    assert ahead.tokens == plain.tokens
    assert ahead.ends == plain.ends
    assert plain.ends["stop-token"] == "stop" and plain.tokens["stop-token"][-1] == mixed[3].params.stop_token_ids[0]
    assert plain.ends["aborted"] == "abort" and len(plain.tokens["aborted"]) == 5
    assert plain.ends["stop-text"] == "abort" and plain.ends["json"] == "stop"
    assert plain.ends["one-token"] == "length" and len(plain.tokens["one-token"]) == 1
    assert (plain.late, ahead.late) == ([], [])
    # Every token after a request's first came from a row planned ahead, but a grammar's or a
    # penalty's; an aborted request ran one more planned row, whose token was dropped.
    plannable = [r for r in plain.tokens if r not in ("json", "penalty")]
    expected = sum(len(plain.tokens[r]) - 1 + (plain.ends[r] == "abort") for r in plannable)
    assert (plain.num_planned_rows, ahead.num_planned_rows) == (0, expected)
    assert ahead.blocks_referenced_after == TierCounts()
    assert ahead.blocks_free_after == ahead.blocks_free_before


@pytest.mark.parametrize("num_host_blocks", [0, 64], ids=["recompute", "swap"])
def test_async_scheduling_with_the_prefix_cache_and_preemption_gives_the_same_tokens(chat, mixed, num_host_blocks):
    """Few blocks: requests are preempted (recomputed, or swapped to the host tier) and prefixes
    reused; the tokens do not change."""
    small = dict(num_device_blocks=40, num_host_blocks=num_host_blocks)
    plain = drive(chat, False, mixed, **small)
    ahead = drive(chat, True, mixed, **small)
    assert ahead.tokens == plain.tokens and ahead.ends == plain.ends
    assert ahead.late == [] and ahead.blocks_referenced_after == TierCounts()
    assert ahead.num_preempted > 0 and ahead.num_planned_rows > 0


def test_async_engine_generates_what_the_plain_engine_generates(chat):
    params = [
        SamplingParams(max_tokens=n, temperature=t, seed=i, ignore_eos=True) for i, (n, t) in enumerate([(5, 0.0), (7, 0.8)])
    ]
    results = []
    for on in (False, True):
        with Engine(tiny_config(chat, verify_files=False, async_scheduling=on)) as e:
            results.append([(c.token_ids, c.finish_reason) for c in e.generate(PROMPTS[:2], params)])
    assert results[1] == results[0]
    assert [len(t) for t, _ in results[1]] == [5, 7]


def test_async_scheduling_refuses_speculative_decoding(chat):
    with pytest.raises(ValueError, match="async scheduling does not combine with speculative decoding"):
        tiny_config(chat, async_scheduling=True, speculative=SpeculativeConfig("ngram"))
