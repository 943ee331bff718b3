"""The steady decode step (wicore.engine.steady): a workload stepped by hand gives the same outputs and
the same steps (rows, starts, order) with it as without, on Gemma 3 (sliding windows), Llama and
Qwen2 (one with a sliding window), greedy and sampled, with and without the sampling head; and each
thing that changes a step's rows or inputs takes the full path (`StepTrace.repeated` False)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.core import EngineCore
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig
from wicore.engine.stats import TierCounts
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.outputs import Priority
from wicore.types.sampling import Logprobs, SamplingParams

RNG = np.random.default_rng(7)
PROMPTS = [RNG.integers(3, 200, int(n)).tolist() for n in (5, 9, 14, 6, 11, 7)]
BLOCK = 4  # tiny_config's block size


def greedy(n: int, **more) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **more)


def seeded(n: int, seed: int, **more) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.8, seed=seed, ignore_eos=True, **more)


@dataclass(frozen=True)
class Arrival:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    at_call: int  # added before this call of step()
    abort_at_call: int | None = None
    priority: Priority = Priority.NORMAL


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    ends: dict[str, str | None] = field(default_factory=dict)
    logprobs: dict[str, list[Logprobs]] = field(default_factory=dict)
    steps: list[list[tuple[str, int, int]]] = field(default_factory=list)  # each step's rows: request, start, tokens
    repeated: list[bool] = field(default_factory=list)  # each step's StepTrace.repeated
    referenced_after: TierCounts = field(default_factory=TierCounts)
    num_preempted: int = 0


def drive(model_dir: Path, steady: bool, arrivals: list[Arrival], decode_graphs: bool = False, **overrides) -> Run:
    """`arrivals` through a core stepped by hand; `decode_graphs`: decode steps through DecodeGraphs'
    buckets, as CUDA graphs run them (on the CPU EP their inputs are what runs: tests/engine/
    test_async_scheduling.py)."""
    scheduler = overrides.pop("scheduler", SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16))
    core = EngineCore(tiny_config(model_dir, scheduler=scheduler, verify_files=False, steady_decode=steady, **overrides))
    if decode_graphs:
        bs, context = core.layout.block_size, core.max_sequence_tokens
        window = -(-core.manifest.config.sliding_window // bs) + 2 if core.layout.has_window else 1
        core.runner.graphs.enable_decode_graphs(bs, core.scheduler.config.max_num_seqs, -(-context // bs), window, context)
    run = Run()
    try:
        call = 0
        while call <= max(a.at_call for a in arrivals) or core.has_work:
            for a in arrivals:
                if a.at_call == call:
                    core.add(core.make_request(a.prompt, a.params, a.request_id, a.priority))
                    run.tokens[a.request_id] = []
                if a.abort_at_call == call:
                    core.abort(a.request_id)
            outputs = core.step()
            if core.last_step.rows:
                run.steps.append([(r.request_id, r.start, len(r.token_ids)) for r in core.last_step.rows])
                run.repeated.append(core.last_step.repeated)
            for out in outputs:
                run.tokens[out.request_id] += out.new_token_ids
                run.logprobs.setdefault(out.request_id, []).extend(out.logprobs or [])
                if out.finished:
                    run.ends[out.request_id] = out.finish_reason
            call += 1
        stats = core.stats()
        run.referenced_after, run.num_preempted = stats.blocks_referenced, stats.preempted_recompute + stats.preempted_swap
    finally:
        core.close()
    return run


def assert_same_run(full: Run, steady: Run) -> None:
    assert steady.steps == full.steps
    assert steady.tokens == full.tokens
    assert steady.ends == full.ends
    assert steady.logprobs == full.logprobs
    assert not any(full.repeated)
    assert steady.referenced_after == full.referenced_after == TierCounts()


def mixed() -> list[Arrival]:
    """Arrivals, an abort, stops by length, host-sampled rows (penalty, top-k, logprobs) beside plain ones."""
    return [
        Arrival("greedy-a", PROMPTS[0], greedy(30), 0),
        Arrival("seeded-a", PROMPTS[1], seeded(25, 1), 0),
        Arrival("late", PROMPTS[2], greedy(12), 9),
        Arrival("aborted", PROMPTS[3], greedy(40), 3, abort_at_call=20),
        Arrival("top-k", PROMPTS[4], seeded(9, 2, top_k=20), 30),
        Arrival("penalty", PROMPTS[5], greedy(8, repetition_penalty=1.3), 31),
        Arrival("logprobs", PROMPTS[0], greedy(7, logprobs=3), 33),
    ]


@pytest.fixture(scope="module")
def chat(tiny_chat):
    return tiny_chat[0]


@pytest.fixture(scope="module")
def chat_with_head(tiny_chat, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_chat_head_steady") / "model"
    export_model(open_source(str(tiny_chat[1])), out, ExportConfig(sampling_head="on"), progress=lambda _: None)
    return out


SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 50_000.0}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1_000_000.0}),
    # a window of 6 with blocks of 4: a block falls behind the window at positions off block boundaries
    "qwen2-sliding": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    ),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> Callable[[str], Path]:
    """families(name) -> a tiny random HF checkpoint of FAMILIES[name], exported (portable fp32), once."""
    made: dict[str, Path] = {}

    def export(name: str) -> Path:
        if name not in made:
            import torch
            import transformers

            config_class, model_class, overrides = FAMILIES[name]
            torch.manual_seed(0)
            cfg = getattr(transformers, config_class)(**SHAPE, **overrides)
            tmp = tmp_path_factory.mktemp(f"steady_{name}")
            getattr(transformers, model_class)(cfg).eval().save_pretrained(tmp / "hf")
            export_model(open_source(str(tmp / "hf")), tmp / "model", ExportConfig(), progress=lambda _: None)
            made[name] = tmp / "model"
        return made[name]

    return export


def expected_repeats(prompt: int, num_steps: int) -> list[tuple[int, bool]]:
    """(start, repeated) of a lone request's decode steps from its first: each repeats the step before
    but the first (the step before ran the prompt), new blocks and released window blocks included."""
    return [(start, start != prompt) for start in range(prompt, prompt + num_steps)]


def lone_decode(run: Run, request_id: str, prompt: int) -> list[tuple[int, bool]]:
    """(start, repeated) of each step whose only row is `request_id`'s decode."""
    return [(s[0][1], r) for s, r in zip(run.steps, run.repeated) if len(s) == 1 and s[0][0] == request_id and s[0][1] >= prompt]


def test_a_mixed_workload_gives_the_full_paths_steps_and_outputs(chat):
    full = drive(chat, False, mixed())
    steady = drive(chat, True, mixed())
    assert_same_run(full, steady)
    assert full.ends["aborted"] == "abort" and full.ends["greedy-a"] == "length"
    assert [len(full.logprobs[r]) for r in ("logprobs", "greedy-a")] == [7, 0]
    assert 0 < sum(steady.repeated) < len(steady.repeated)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_llama_and_qwen2_greedy_and_sampled_give_the_full_paths_tokens(families, name):
    family = families(name)
    arrivals = [
        Arrival("greedy", PROMPTS[0], greedy(40), 0),
        Arrival("seeded", PROMPTS[1], seeded(33, 4), 0),
        Arrival("late", PROMPTS[2], seeded(20, 5, top_p=0.9), 6),
    ]
    full = drive(family, False, arrivals)
    steady = drive(family, True, arrivals)
    assert_same_run(full, steady)
    assert [len(steady.tokens[a.request_id]) for a in arrivals] == [40, 33, 20]
    assert sum(steady.repeated) > len(steady.repeated) // 2


@pytest.mark.parametrize("decode_graphs", [False, True], ids=["uncaptured", "decode-graphs"])
def test_the_sampling_heads_draws_give_the_full_paths_tokens(chat_with_head, decode_graphs):
    arrivals = [Arrival(f"whole-{i}", PROMPTS[i], seeded(20 + 3 * i, i), 0) for i in range(3)]
    arrivals += [Arrival("top-k", PROMPTS[3], seeded(15, 9, top_k=5), 2), Arrival("greedy", PROMPTS[4], greedy(18), 2)]
    full = drive(chat_with_head, False, arrivals, decode_graphs)
    steady = drive(chat_with_head, True, arrivals, decode_graphs)
    assert_same_run(full, steady)
    assert sum(steady.repeated) > 0


@pytest.mark.parametrize("name", ["llama", "qwen2-sliding"])
def test_a_lone_decode_repeats_through_new_blocks_and_released_window_blocks(families, name):
    """Blocks of 4, qwen2-sliding's window 6: a block falls behind the window at positions 9, 13, ...,
    off the block boundaries 8, 12, ... that start a new block; the steady steps append and release as
    `schedule` does (the same tokens and steps as without them)."""
    prompt = PROMPTS[0]  # 5 tokens
    arrivals = [Arrival("a", prompt, greedy(16), 0)]
    run = drive(families(name), True, arrivals)
    assert_same_run(drive(families(name), False, arrivals), run)
    assert lone_decode(run, "a", len(prompt)) == expected_repeats(len(prompt), 15)


def test_changes_to_the_running_set_take_the_full_path(chat):
    """An arrival with room, an abort, a request that ends: the next step is scheduled; a request
    waiting for a full batch (max_num_seqs) changes nothing the schedule would do: repeated."""
    arrivals = [
        Arrival("a", PROMPTS[0], greedy(60), 0),
        Arrival("b", PROMPTS[1], greedy(14), 0),
        Arrival("arrives", PROMPTS[2], greedy(4), 17),
        Arrival("aborted", PROMPTS[3], greedy(50), 30, abort_at_call=45),
    ]
    run = drive(chat, True, arrivals, scheduler=SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16, max_num_seqs=3))
    assert_same_run(
        drive(chat, False, arrivals, scheduler=SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16, max_num_seqs=3)), run
    )
    ids = [{r[0] for r in s} for s in run.steps]
    for i in range(1, len(ids)):
        if ids[i] != ids[i - 1]:
            assert not run.repeated[i], f"step {i}: the rows changed, yet it repeated"
    # every step that repeats runs the last step's requests, each one position further
    for i, rep in enumerate(run.repeated):
        if rep:
            assert [(r, s - 1, n) for r, s, n in run.steps[i]] == run.steps[i - 1]
    assert run.ends["aborted"] == "abort"


def test_a_better_ranked_request_admitted_as_a_decode_row_is_sorted_in_as_the_full_path_does(chat):
    """A prompt whose blocks but its last token are cached is admitted as a one-token row, after the
    running rows whatever its rank: the step after, scheduled in full, puts the urgent request first;
    a repeat of the admitting step would have kept it last."""
    shared = PROMPTS[1][:8]  # two blocks, cached once "first" has run its prompt
    arrivals = [
        Arrival("first", [*shared, 7], greedy(16), 0),
        Arrival("second", PROMPTS[0], greedy(16), 0),
        Arrival("urgent", [*shared, 9], greedy(6), 4, priority=Priority.HIGH),
    ]
    full, steady = drive(chat, False, arrivals), drive(chat, True, arrivals)
    assert_same_run(full, steady)
    admitted = next(i for i, step in enumerate(full.steps) if any(r == "urgent" for r, _, _ in step))
    assert [(r, n) for r, _, n in full.steps[admitted]] == [("first", 1), ("second", 1), ("urgent", 1)]
    assert [r for r, _, _ in full.steps[admitted + 1]] == ["urgent", "first", "second"]
    assert steady.repeated[admitted + 1] is False and steady.repeated[admitted + 2] is True


def test_a_full_batch_with_a_request_waiting_still_repeats(families):
    """max_num_seqs 1: the request that waits changes nothing `schedule` would do until the first ends."""
    arrivals = [Arrival("a", PROMPTS[0], greedy(20), 0), Arrival("waits", PROMPTS[1], greedy(3), 2)]
    one = SchedulerConfig(max_num_batched_tokens=40, prefill_chunk=16, max_num_seqs=1)
    run = drive(families("llama"), True, arrivals, scheduler=one)
    assert_same_run(drive(families("llama"), False, arrivals, scheduler=one), run)
    assert lone_decode(run, "a", len(PROMPTS[0])) == expected_repeats(len(PROMPTS[0]), 19)
    assert lone_decode(run, "waits", len(PROMPTS[1])) == expected_repeats(len(PROMPTS[1]), 2)


@pytest.mark.parametrize("num_host_blocks", [0, 32], ids=["recompute", "swap"])
def test_a_pool_without_room_preempts_as_the_full_path_does(chat, num_host_blocks):
    """Few blocks, the prefix cache on: a steady step's append finds no room (the full path preempts
    then, the appends before it kept) or evicts cached blocks (moves): the same steps and tokens."""
    arrivals = [Arrival(f"r{i}", PROMPTS[i], greedy(24), i) for i in range(4)]
    small = dict(num_device_blocks=20, num_host_blocks=num_host_blocks)
    full = drive(chat, False, arrivals, **small)
    steady = drive(chat, True, arrivals, **small)
    assert_same_run(full, steady)
    assert steady.num_preempted == full.num_preempted > 0
    assert sum(steady.repeated) > 0


@pytest.mark.parametrize(
    "params",
    [
        greedy(12, repetition_penalty=1.2),
        greedy(12, logprobs=2),
        greedy(12, logit_bias=((5, 1.0),)),
    ],
    ids=["penalty", "logprobs", "logit-bias"],
)
def test_rows_whose_sampling_keeps_state_never_repeat(chat, params):
    run = drive(chat, True, [Arrival("a", PROMPTS[0], params, 0)])
    assert len(run.tokens["a"]) == 12 and not any(run.repeated)


def test_speculative_decoding_never_repeats(chat):
    run = drive(chat, True, [Arrival("a", PROMPTS[0] * 3, greedy(12), 0)], speculative=SpeculativeConfig("ngram"))
    assert len(run.tokens["a"]) == 12 and not any(run.repeated)


def test_a_repeated_step_that_fails_ends_its_requests_and_the_next_is_scheduled(chat):
    core = EngineCore(tiny_config(chat, verify_files=False))
    try:
        core.add(core.make_request(PROMPTS[0], greedy(20), "a"))
        while not core.last_step.repeated:
            core.step()
        execute = core.runner.execute_prepared

        def fail(step):
            raise RuntimeError("kernel failed")

        core.runner.execute_prepared = fail
        (out,) = core.step()
        assert (out.finish_reason, "kernel failed" in (out.error or "")) == ("error", True)
        core.runner.execute_prepared = execute
        core.add(core.make_request(PROMPTS[1], greedy(3), "b"))
        tokens = [t for o in core.run_to_end() for t in o.new_token_ids]
        assert len(tokens) == 3 and core.stats().blocks_referenced == TierCounts()
    finally:
        core.close()
