"""Async scheduling (wicore.engine.lookahead) on the tiny chat model: a workload driven by hand gives
exactly the outputs it gives without (tokens, finish reasons, logprobs, prompt and cached token
counts), no request sends anything after its final output, and every block comes back to the pool;
greedy requests run every decode row fed from the step before (each ended request one or two rows
more, dropped), host-sampled ones in synchronous steps."""

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
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.structured.spec import StructuredKind, StructuredOutput
from wicore.types.sampling import Logprobs, SamplingParams

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
    logprobs: dict[str, list[Logprobs]] = field(default_factory=dict)
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)  # prompt tokens, cached prompt tokens
    steps: list[list[tuple[str, int, int]]] = field(default_factory=list)  # each step's rows: request, start, tokens
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
        Arrival("logprobs", PROMPTS[2], SamplingParams(max_tokens=7, logprobs=3, ignore_eos=True), 8),
    ]


def greedy_workload(stop_token: int, stop_text: str) -> list[Arrival]:
    """Greedy requests only, all at the first call, their prompts (32 tokens) in one step: every step
    after the first is scheduled ahead."""
    return [
        Arrival("greedy-a", PROMPTS[0], SamplingParams(max_tokens=12, ignore_eos=True), 0),
        Arrival("stop-token", PROMPTS[3], SamplingParams(max_tokens=16, stop_token_ids=(stop_token,), ignore_eos=True), 0),
        Arrival("aborted", PROMPTS[4], SamplingParams(max_tokens=30, ignore_eos=True), 0, abort_after=5),
        Arrival("stop-text", PROMPTS[5], SamplingParams(max_tokens=30, ignore_eos=True), 0, stop_text=stop_text),
        Arrival("one-token", PROMPTS[0], SamplingParams(max_tokens=1), 0),
    ]


def make_core(model_dir, async_scheduling: bool, **overrides) -> EngineCore:
    scheduler = SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16, prefill_with_decodes=16)
    return EngineCore(
        tiny_config(model_dir, scheduler=scheduler, verify_files=False, async_scheduling=async_scheduling, **overrides)
    )


def drive(model_dir, async_scheduling: bool, arrivals: list[Arrival], decode_graphs: bool = False, **overrides) -> Run:
    """`arrivals` through a core stepped by hand; `decode_graphs`: decode steps through DecodeGraphs'
    buckets, as CUDA graphs run them (on the CPU EP the graph ids are ignored: the buckets' inputs,
    their two host sides and the fed ids written into them are what runs)."""
    core = make_core(model_dir, async_scheduling, **overrides)
    if decode_graphs:
        bs, context = core.layout.block_size, core.max_sequence_tokens
        core.runner.graphs.enable_decode_graphs(bs, core.scheduler.config.max_num_seqs, -(-context // bs), 1, context)
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
            outputs = core.step()
            if core.last_step.rows:
                run.steps.append([(r.request_id, r.start, len(r.token_ids)) for r in core.last_step.rows])
            for out in outputs:
                if out.request_id in run.ends:
                    run.late.append(out.request_id)
                run.tokens[out.request_id] += out.new_token_ids
                run.logprobs.setdefault(out.request_id, []).extend(out.logprobs or [])
                if out.finished:
                    run.ends[out.request_id] = out.finish_reason
                    run.usage[out.request_id] = (out.num_prompt_tokens, out.num_cached_tokens)
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


def real_rows(run: Run, prompts: dict[str, int]) -> list[list[tuple[str, int, int]]]:
    """Each step's rows but those that ran past their request's last token (dropped under async
    scheduling): a row is real when its input is a prompt token or an output but the last."""
    last = {r: prompts[r] + len(t) - 2 for r, t in run.tokens.items()}
    return [kept for step in run.steps if (kept := [row for row in step if row[1] <= last[row[0]]])]


def assert_same_outputs(plain: Run, ahead: Run, arrivals: list[Arrival] | None = None) -> None:
    """The same outputs; with `arrivals`, also the same steps (rows and their order, the dropped ones
    aside): on a GPU a batch's rounding follows its rows, so a sampled token would move otherwise."""
    if arrivals is not None:
        prompts = {a.request_id: len(a.prompt) for a in arrivals}
        assert real_rows(ahead, prompts) == real_rows(plain, prompts) == plain.steps
    assert ahead.tokens == plain.tokens
    assert ahead.ends == plain.ends
    assert ahead.logprobs == plain.logprobs
    assert ahead.usage == plain.usage
    assert (plain.late, ahead.late) == ([], [])
    assert ahead.blocks_referenced_after == TierCounts()


def extra_rows(run: Run, request_id: str) -> int:
    """Fed rows a request ran past its last token: one after a stop (its next row was in flight), two
    after an abort the caller sent on receiving a token (the row of the token after it was in flight
    and the next one planned before the abort was applied); none after its last token by max_tokens."""
    return {"stop": 1, "abort": 2}.get(run.ends[request_id] or "", 0)


@pytest.mark.parametrize("decode_graphs", [False, True], ids=["uncaptured", "decode-graphs"])
def test_greedy_requests_run_every_decode_row_fed_from_the_step_before(chat, mixed, decode_graphs):
    stop_token = mixed[3].params.stop_token_ids[0]
    stop_text = next(a.stop_text for a in mixed if a.stop_text is not None)
    arrivals = greedy_workload(stop_token, stop_text)
    plain = drive(chat, False, arrivals, decode_graphs, enable_prefix_cache=False)
    ahead = drive(chat, True, arrivals, decode_graphs, enable_prefix_cache=False)
    assert_same_outputs(plain, ahead, arrivals)
    assert plain.ends == {
        "greedy-a": "length", "stop-token": "stop", "aborted": "abort", "stop-text": "abort", "one-token": "length"
    }  # fmt: skip
    assert [len(plain.tokens[r]) for r in ("greedy-a", "aborted", "one-token")] == [12, 5, 1]
    assert plain.tokens["stop-token"][-1] == stop_token
    # Every token after a request's first came from a fed row planned while the step before ran.
    expected = sum(len(plain.tokens[r]) - 1 + extra_rows(plain, r) for r in plain.tokens)
    assert (plain.num_planned_rows, ahead.num_planned_rows) == (0, expected)
    assert ahead.num_steps == plain.num_steps  # the dropped rows ran in steps that greedy-a ran anyway
    assert ahead.blocks_free_after == ahead.blocks_free_before


def test_a_mixed_workload_gives_the_same_outputs_and_frees_every_block(chat, mixed):
    """Seeded, top-k, penalized, constrained and logprobs rows sample on the host: the steps after
    theirs are synchronous, and the outputs those of the plain engine all the same."""
    plain = drive(chat, False, mixed, enable_prefix_cache=False)
    ahead = drive(chat, True, mixed, enable_prefix_cache=False)
    assert_same_outputs(plain, ahead, mixed)
    assert plain.ends["stop-token"] == "stop" and plain.tokens["stop-token"][-1] == mixed[3].params.stop_token_ids[0]
    assert plain.ends["aborted"] == "abort" and len(plain.tokens["aborted"]) == 5
    assert plain.ends["stop-text"] == "abort" and plain.ends["json"] == "stop"
    assert plain.ends["one-token"] == "length" and len(plain.tokens["one-token"]) == 1
    assert [len(plain.logprobs[r]) for r in ("logprobs", "greedy-a")] == [7, 0]
    assert 0 < ahead.num_planned_rows < sum(len(t) for t in plain.tokens.values())
    assert ahead.blocks_free_after == ahead.blocks_free_before


@pytest.mark.parametrize("num_host_blocks", [0, 64], ids=["recompute", "swap"])
@pytest.mark.parametrize("greedy", [False, True], ids=["mixed", "greedy"])
def test_async_scheduling_with_the_prefix_cache_and_preemption_gives_the_same_outputs(chat, mixed, num_host_blocks, greedy):
    """Few blocks: requests are preempted (recomputed, or swapped to the host tier and back, their
    moves run on the worker behind the step in flight) and prefixes reused; the outputs do not change.
    The steps do: scheduled before N's result, N+1 cannot use the blocks or the room of the requests
    N ends, so it preempts or admits otherwise (on the CPU a row's logits do not follow its batch)."""
    small = dict(num_device_blocks=14 if greedy else 40, num_host_blocks=num_host_blocks)
    arrivals = mixed
    if greedy:  # two more, arriving while steps are scheduled ahead, and fewer blocks
        stop_text = next(a.stop_text for a in mixed if a.stop_text is not None)
        arrivals = greedy_workload(mixed[3].params.stop_token_ids[0], stop_text) + [
            Arrival("late-a", PROMPTS[6], SamplingParams(max_tokens=20, ignore_eos=True), 3),
            Arrival("late-b", PROMPTS[2], SamplingParams(max_tokens=20, ignore_eos=True), 5),
        ]
    plain = drive(chat, False, arrivals, **small)
    ahead = drive(chat, True, arrivals, **small)
    assert_same_outputs(plain, ahead)  # the steps differ: blocks of a request ended by N come back after N+1
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


def test_the_default_is_off_on_the_cpu_and_a_worker_runs_only_when_on(chat):
    for setting, expected in ((None, False), (True, True), (False, False)):
        with Engine(tiny_config(chat, verify_files=False, async_scheduling=setting)) as e:
            assert e.config.async_scheduling is expected
            assert (e.core._worker is not None) is expected


def test_async_scheduling_refuses_speculative_decoding(chat):
    with pytest.raises(ValueError, match="async scheduling does not combine with speculative decoding"):
        tiny_config(chat, async_scheduling=True, speculative=SpeculativeConfig("ngram"))


@pytest.fixture(scope="module")
def chat_with_head(tiny_chat, tmp_path_factory):
    """The tiny chat model exported with the sampling head: whole-distribution rows draw on the device."""
    out = tmp_path_factory.mktemp("tiny_chat_head") / "model"
    export_model(open_source(str(tiny_chat[1])), out, ExportConfig(sampling_head="on"), progress=lambda _: None)
    return out


@pytest.mark.parametrize("decode_graphs", [False, True], ids=["uncaptured", "decode-graphs"])
def test_rows_the_sampling_head_draws_are_fed_too(chat_with_head, decode_graphs):
    """Seeded rows that sample the whole tempered distribution take the head's draw: their next rows
    are fed from it as greedy ones are from the argmax, and give the plain engine's tokens; a top-k
    row picks from the head's candidates on the host, and the steps after its rows are synchronous."""

    def sampled(i: int, n: int, **more) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0.8, seed=i, ignore_eos=True, **more)

    # prompts of one chunk each, 35 tokens in all: one step prefills them, every later one is ahead
    whole = [Arrival(f"whole-{i}", PROMPTS[p], sampled(i, 6 + 3 * i), 0) for i, p in enumerate((0, 1, 3, 5, 7))]
    greedy = [Arrival("greedy", PROMPTS[0], SamplingParams(max_tokens=9, ignore_eos=True), 0)]
    plain = drive(chat_with_head, False, whole + greedy, decode_graphs)
    ahead = drive(chat_with_head, True, whole + greedy, decode_graphs)
    assert_same_outputs(plain, ahead, whole + greedy)
    assert [len(plain.tokens[f"whole-{i}"]) for i in range(5)] == [6, 9, 12, 15, 18]
    assert ahead.num_planned_rows == sum(len(t) - 1 for t in plain.tokens.values())
    top_k = [Arrival("top-k", PROMPTS[6], sampled(9, 8, top_k=5), 0)]
    mixed_plain = drive(chat_with_head, False, whole + top_k, decode_graphs)
    mixed_ahead = drive(chat_with_head, True, whole + top_k, decode_graphs)
    assert_same_outputs(mixed_plain, mixed_ahead, whole + top_k)
    assert 0 < mixed_ahead.num_planned_rows < sum(len(t) - 1 for t in mixed_plain.tokens.values())


def test_a_prompt_admitted_beside_fed_rows_gets_the_chunk_it_gets_without_the_flag(chat_with_head):
    """The step after a prefill is planned before that prefill returns: its fed rows are decodes and
    take none of prefill_with_decodes' tokens (16 here), so a prompt admitted beside them is cut as
    without the flag. They took one each once (the GPU check of 2026-11-28: a batch of other shapes
    in the step after the prompts, other rounding, sampled tokens that moved)."""

    def sampled(i: int) -> SamplingParams:
        return SamplingParams(max_tokens=6, temperature=0.8, seed=i, ignore_eos=True)

    arrivals = [Arrival(f"whole-{i}", PROMPTS[p], sampled(i), 0) for i, p in enumerate((0, 1, 5))]
    arrivals += [
        Arrival("greedy", PROMPTS[3], SamplingParams(max_tokens=6, ignore_eos=True), 0),
        Arrival("long", PROMPTS[8], SamplingParams(max_tokens=3, ignore_eos=True), 1),  # 60 tokens, after the first step
    ]
    plain = drive(chat_with_head, False, arrivals)
    ahead = drive(chat_with_head, True, arrivals)
    assert_same_outputs(plain, ahead, arrivals)
    assert [row for row in ahead.steps[1] if row[2] > 1] == [("long", 0, 16)]
    # planned ahead: step 1's four decodes, then (while "long" has chunks to come the steps are
    # synchronous) the five rows after its last chunk and its own last one
    assert ahead.num_planned_rows == 4 + 5 + 1


def test_a_failed_step_fails_its_own_requests_not_those_of_the_step_queued_behind_it(chat):
    """A step whose run raises fails its rows' requests, as without the flag. The step queued behind it
    (scheduled ahead while it ran) still runs for the requests that were not in it: a request admitted
    beside the failed request's fed row ends as it ends without async scheduling, not with its error."""
    runs = {}
    for on in (False, True):
        core = make_core(chat, on)
        real, calls = core.runner.run_device, []

        def flaky(step, previous=None, feeds=True, real=real, calls=calls):
            calls.append(step)
            if len(calls) == 2:  # "a"'s first decode step
                raise RuntimeError("the device broke once")
            return real(step, previous, feeds)

        core.runner.run_device = flaky
        ends: dict[str, str | None] = {}
        tokens: dict[str, list[int]] = {"a": [], "b": []}
        try:
            core.add(core.make_request(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True), "a"))
            for call in range(40):
                if call == 2:  # before the step after "a"'s failing one is scheduled
                    core.add(core.make_request(PROMPTS[1], SamplingParams(max_tokens=4, ignore_eos=True), "b"))
                for out in core.step():
                    tokens[out.request_id] += out.new_token_ids
                    if out.finished:
                        ends[out.request_id] = out.finish_reason
                if call >= 2 and not core.has_work:
                    break
            referenced = core.stats().blocks_referenced
        finally:
            core.close()
        runs[on] = (ends, tokens["b"], referenced)
    assert runs[False][0] == {"a": "error", "b": "length"} and runs[False][2] == TierCounts()
    assert runs[True] == runs[False]
