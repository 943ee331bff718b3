"""The engine end to end on a tiny random Gemma 3: concurrency, preemption, tiers, prefix cache,
admission. What a prompt generates is checked against HF transformers' greedy generation."""

from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.engine import Engine
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.stats import TierCounts
from wicore.errors import ContextLengthError, OverloadedError, RequestError
from wicore.types.sampling import SamplingParams

RNG = np.random.default_rng(7)
PROMPTS = [RNG.integers(3, 512, int(n)).tolist() for n in RNG.integers(3, 60, 12)]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_export):
    return tiny_export(2)  # (exported folder, HF model)


@pytest.fixture(scope="module")
def model_dir(tiny):
    return tiny[0]


@pytest.fixture(scope="module")
def alone(tiny, reference_greedy):
    """What each prompt generates on its own: HF transformers' greedy generation."""
    return [reference_greedy(tiny[1], p, 10) for p in PROMPTS]


def engine(model_dir, **overrides) -> Engine:
    return Engine(
        tiny_config(model_dir, **{"scheduler": SchedulerConfig(max_num_batched_tokens=48, prefill_chunk=16), **overrides})
    )


def run_all(eng: Engine, prompts, params=GREEDY, stagger: float = 0.0) -> list[list[int]]:
    """Add the prompts (`stagger` seconds apart), start the engine if needed, collect the outputs.

    Without stagger every request is queued before the first step, so the load (and
    any preemption it forces) does not depend on thread timing.
    """
    ids = []
    for p in prompts:
        ids.append(eng.add_request(p, params))
        time.sleep(stagger)
    eng.start()
    return [[t for out in eng.outputs(i) for t in out.new_token_ids] for i in ids]


def test_an_engine_goes_with_its_last_reference_not_at_the_cyclic_gcs_next_run(model_dir, alone):
    """Its sessions and KV buffers (GiBs for a real model) are freed when the engine is: a reference
    cycle (core -> grammars -> a bound method of core) had left them to Python's cyclic collector,
    which seldom runs a full pass in a long process (the suite's grew past 20 GiB). The sessions go
    at stop() even while something still holds the engine."""
    gc.disable()
    try:
        with engine(model_dir) as eng:
            assert run_all(eng, PROMPTS[:2]) == alone[:2]
            refs = [weakref.ref(eng), weakref.ref(eng.core), weakref.ref(eng.core.runner.graphs), weakref.ref(eng.core.kv)]
            sessions = [weakref.ref(s) for s in eng.core.runner.graphs.sessions]
        # Stopped but still referenced (as a served app's cycles keep it): the sessions are gone already.
        assert len(sessions) == 2 and [ref() for ref in sessions] == [None, None]
        del eng
        assert [ref() for ref in refs] == [None] * len(refs)
    finally:
        gc.enable()


def test_concurrent_requests_generate_what_they_generate_alone(model_dir, alone):
    with engine(model_dir).start() as eng:  # requests arrive while earlier ones run
        assert run_all(eng, PROMPTS, stagger=0.005) == alone
        stats = eng.stats()
    assert stats.running == stats.waiting == stats.swapped == 0
    assert stats.generated_tokens == 10 * len(PROMPTS)


def test_preemption_by_swap_to_host_is_lossless(model_dir, alone):
    # 40 usable device blocks cannot hold 12 requests of up to ~70 tokens (18 blocks each).
    with engine(model_dir, num_device_blocks=41, num_host_blocks=200) as eng:
        assert run_all(eng, PROMPTS) == alone
        stats = eng.stats()
    assert stats.preempted_swap > 0
    # Every request ended: what is left on the host is prefix cache, referenced by nobody.
    assert stats.blocks_in_use.host > 0 and stats.blocks_referenced.host == 0


def test_sliding_layers_release_blocks_behind_the_window(tiny, reference_greedy):
    """Window 8, block size 4, chunks of 16: a sequence holds at most 7 window blocks
    ((8 - 1 + 16) / 4 + 1), so 8 device blocks (one the sink) serve 100-token requests."""
    model_dir, hf_model = tiny
    prompts = [RNG.integers(3, 512, 60).tolist(), RNG.integers(3, 512, 70).tolist()]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [reference_greedy(hf_model, p, 40) for p in prompts]
    with engine(model_dir, num_window_device_blocks=8, scheduler=SchedulerConfig(max_num_seqs=1, prefill_chunk=16)) as eng:
        assert run_all(eng, prompts, params) == expected
        groups = eng.stats().kv_groups
    assert groups["window"].layers == 3 and groups["full"].layers == 1
    assert groups["window"].blocks_in_use.device + groups["window"].blocks_free.device == 7
    # The full group keeps each request's full computed blocks cached: 99 and 109 tokens
    # have KV (the last sampled token never ran), 24 and 27 full blocks.
    assert groups["full"].blocks_in_use.device == 24 + 27


def test_preemption_by_recompute_when_no_tier_below(model_dir, alone):
    with engine(model_dir, num_device_blocks=41) as eng:
        assert run_all(eng, PROMPTS) == alone
        stats = eng.stats()
    assert stats.preempted_swap == 0 and stats.preempted_recompute > 0


def corrupt_every_write(nvme) -> None:
    original_write = nvme.write

    def write_then_corrupt(slot, data):
        original_write(slot, data)
        with open(nvme.path, "r+b") as f:  # one byte flipped, behind the store's back
            f.seek(slot * nvme.frame_bytes)
            value = f.read(1)[0]
            f.seek(slot * nvme.frame_bytes)
            f.write(bytes([value ^ 0x40]))

    nvme.write = write_then_corrupt


def test_corrupt_nvme_block_is_detected_and_recomputed(model_dir, alone, tmp_path):
    """Swaps go straight to NVMe (no host tier); every block written there is corrupted
    behind the store's back, so each swap-in finds a bad checksum and recomputes."""
    with engine(model_dir, num_device_blocks=41, num_nvme_blocks=400, nvme_dir=tmp_path) as eng:
        for pager in eng.core.kv.pagers:  # both block groups: full-attention and sliding layers
            corrupt_every_write(pager.stores[2])
        assert run_all(eng, PROMPTS) == alone
        stats = eng.stats()
    assert stats.preempted_swap > 0
    assert stats.corrupt_blocks > 0


def test_prefix_cache_prefills_only_the_suffix(model_dir):
    prefix = RNG.integers(3, 512, 100).tolist()
    first, second = [*prefix, 5, 6, 7], [*prefix, 9, 10]
    with engine(model_dir) as eng:
        out_first = run_all(eng, [first])[0]
        before = eng.stats().computed_prompt_tokens
        out_second = run_all(eng, [second])[0]
        computed = eng.stats().computed_prompt_tokens - before
        hit_rate = eng.stats().prefix_hit_rate
    with engine(model_dir, enable_prefix_cache=False) as eng:
        assert run_all(eng, [first, second]) == [out_first, out_second]
    # 100 shared tokens = 25 full blocks of 4 are reused; the second prompt runs its own 2 tokens.
    assert computed == 2
    assert hit_rate == pytest.approx(100 / (103 + 102))


def test_questions_over_one_document_sent_together_compute_it_once(model_dir):
    """Three prompts sharing a 100-token document, queued together: the first computes the
    document, the others wait for its blocks and prefill only what is theirs."""
    document = RNG.integers(3, 512, 100).tolist()
    prompts = [[*document, 5, 6, 7], [*document, 9, 10], [*document, 11]]
    with engine(model_dir, enable_prefix_cache=False) as eng:
        expected = run_all(eng, prompts)
        assert eng.stats().computed_prompt_tokens == 103 + 102 + 101
    with engine(model_dir) as eng:
        assert run_all(eng, prompts) == expected
        # 100 shared tokens = 25 full blocks of 4, computed once; the others run their own 2 and 1.
        assert eng.stats().computed_prompt_tokens == 103 + 2 + 1


def test_abort_returns_blocks_and_ends_the_stream(model_dir):
    with engine(model_dir).start() as eng:
        rid = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))
        outputs = eng.outputs(rid)
        seen = []
        for out in outputs:
            seen.append(out)
            if len(seen) == 3:
                eng.abort(rid)
        assert seen[-1].finished and seen[-1].finish_reason == "abort"
        assert 3 <= len(seen) < 200
        deadline = time.monotonic() + 5
        while eng.stats().running and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = eng.stats()
    assert stats.running == 0
    # Only prefix-cached (unreferenced, reusable) blocks remain on the device.
    assert stats.blocks_referenced.device == 0


def test_deadline_ends_a_request(model_dir):
    with engine(model_dir).start() as eng:
        rid = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=250, ignore_eos=True), deadline=0.05)
        last = list(eng.outputs(rid))[-1]
    assert last.finish_reason == "deadline"


def test_waiting_queue_limit_rejects_with_overloaded(model_dir):
    eng = engine(model_dir, scheduler=SchedulerConfig(max_waiting=2))  # not started: nothing drains
    eng.add_request([5, 6], GREEDY)
    eng.add_request([5, 7], GREEDY)
    with pytest.raises(OverloadedError) as err:
        eng.add_request([5, 8], GREEDY, request_id="third")
    assert str(err.value) == "overloaded: 2 requests already waiting; retry later"
    assert eng.num_queued == 2 and not eng.has_request("third")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "the prompt is empty"),
        ([5, 512], "token ids must be in [0, 512)"),
        ([-1, 5], "token ids must be in [0, 512)"),
    ],
)
def test_malformed_prompts_are_refused_and_not_queued(model_dir, prompt, message):
    with engine(model_dir) as eng:
        with pytest.raises(RequestError) as err:
            eng.add_request(prompt, GREEDY, request_id="bad")
        assert eng.num_queued == 0 and not eng.has_request("bad")
    assert type(err.value) is RequestError and str(err.value) == message


def test_a_request_id_in_use_is_refused(model_dir):
    with engine(model_dir) as eng:
        assert eng.add_request([5, 6], GREEDY, request_id="a") == "a"
        with pytest.raises(RequestError) as err:
            eng.add_request([5, 7], GREEDY, request_id="a")
        assert eng.num_queued == 1
    assert type(err.value) is RequestError and str(err.value) == "request id 'a' is already in use"


def test_a_prompt_that_fills_the_device_kv_cache_is_refused_and_a_shorter_one_is_capped(tiny, reference_greedy):
    """5 device blocks of 4, one the sink: 16 tokens per sequence. A 16-token prompt has no
    room; a 12-token prompt asking for 10 tokens gets 4 (HF's first 4), ending with "length"."""
    model_dir, hf_model = tiny
    with engine(model_dir, num_device_blocks=5) as eng:
        assert eng.max_sequence_tokens == 16 and eng.max_context == 256
        with pytest.raises(ContextLengthError) as err:
            eng.add_request(list(range(3, 19)), GREEDY, request_id="long")
        assert str(err.value) == (
            "the prompt has 16 tokens; the device KV cache holds 16 tokens (prompt plus at least one generated token); "
            "kv_pool_gb 0.01 holds one sequence of 17 tokens; 64 such sequences at once take kv_pool_gb 0.01 "
            "(wicore plan --context 17 shows what else fits)"
        )
        assert not eng.has_request("long")
        prompt = list(range(3, 15))
        [done] = eng.generate([prompt], GREEDY)
    assert (done.token_ids, done.finish_reason, done.num_prompt_tokens) == (reference_greedy(hf_model, prompt, 4), "length", 12)


def test_the_kv_pool_the_refusal_names_holds_the_prompt(tiny, reference_greedy):
    """A pool for one sequence of 49 full blocks (one the sink: 192 tokens) and the 8 window blocks
    of the max_num_seqs = 1 reservation (ceil((8 - 1 + 16) / 4) + 1 = 7, and the sink) refuses a
    200-token prompt. The pool it names holds it: 200 + 1 tokens need 51 blocks and the sink, of
    2 KiB each (1 full layer x K, V x 4 tokens x 2 heads x 32 x 4 B), and the 8 window blocks of
    6 KiB (3 sliding layers): 152 KiB, 0.01 GiB rounded up."""
    model_dir, hf_model = tiny
    prompt = np.random.default_rng(3).integers(3, 512, 200).tolist()
    pool = (49 * 2048 + 8 * 6144) / (1 << 30)
    small = dict(num_device_blocks=None, kv_pool_gb=pool, scheduler=SchedulerConfig(max_num_seqs=1, prefill_chunk=16))
    with engine(model_dir, **small) as eng:
        assert eng.max_sequence_tokens == 192
        assert eng.layout.pool_bytes(1, 201, 16) == 52 * 2048 + 8 * 6144
        with pytest.raises(ContextLengthError, match="kv_pool_gb 0.01 holds one sequence of 201 tokens "):
            eng.add_request(prompt, GREEDY)
    with engine(model_dir, **{**small, "kv_pool_gb": 0.01}) as eng:
        [done] = eng.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))
    assert (done.token_ids, done.num_prompt_tokens) == (reference_greedy(hf_model, prompt, 2), 200)


def test_a_request_the_sliding_layers_cache_cannot_hold_is_refused(model_dir):
    """5 window device blocks (4 usable): 10 prompt + 10 new tokens need 5 blocks; 10 + 6 need 4."""
    eng = engine(model_dir, num_window_device_blocks=5)
    with pytest.raises(RequestError) as err:
        eng.add_request(list(range(3, 13)), GREEDY, request_id="wide")
    assert type(err.value) is RequestError and str(err.value) == (
        "the request needs up to 5 blocks in the sliding-window layers' KV cache, which holds 4 "
        "(raise kv_pool_gb or lower prefill_chunk)"
    )
    assert not eng.has_request("wide")
    eng.add_request(list(range(3, 13)), SamplingParams(max_tokens=6, ignore_eos=True), request_id="narrow")
    assert eng.has_request("narrow")


def test_generate_refusing_one_prompt_queues_none(model_dir):
    """`generate` raises for a prompt with no room; the prompts before it must not stay queued
    (they would run later with nobody to read them, their channels kept forever)."""
    with engine(model_dir, scheduler=SchedulerConfig(max_context=20, prefill_chunk=16)) as eng:
        with pytest.raises(ContextLengthError):
            eng.generate([[5, 6, 7], list(range(3, 30))], GREEDY)
        eng.start()  # the prompt queued before the refused one was aborted: it ends at the first step
        deadline = time.monotonic() + 30
        while eng.has_request("req-0") and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = eng.stats()
        assert (stats.running, stats.waiting, stats.generated_tokens, stats.computed_prompt_tokens) == (0, 0, 0, 0)
        assert eng.stats().blocks_referenced == TierCounts()
        with pytest.raises(RequestError, match="unknown request id"):
            eng.outputs("req-0")  # its channel was claimed and forgotten


def test_attention_stats_reach_the_kv_cache_and_change_no_output(tiny_model, alone, tmp_path):
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    folder, _ = tiny_model()
    stats_dir = tmp_path / "stats"
    export_model(
        open_source(str(folder)), stats_dir, ExportConfig(num_partitions=2, attention_stats=True), progress=lambda _: None
    )
    eng = engine(stats_dir)
    received = []
    record = eng.core.kv.record_attention

    def record_and_keep(block_ids, mass):
        assert len(block_ids) == len(mass)
        received.extend(mass)
        record(block_ids, mass)

    eng.core.kv.record_attention = record_and_keep
    with eng:
        assert run_all(eng, PROMPTS) == alone
    # Every step's mass over a row's blocks sums to full-attention layers * heads * tokens run
    # (1 * 4 per token: the sliding layers do not report).
    num_tokens = sum(len(p) for p in PROMPTS) + 9 * len(PROMPTS)  # prompts, then 9 decode steps each
    assert sum(received) == pytest.approx(4 * num_tokens, rel=1e-4)


def test_async_stream_delivers_everything_and_releases_the_channel(model_dir, alone):
    import asyncio

    async def consume(eng: Engine, rid: str) -> list[int]:
        return [t async for out in eng.stream(rid) for t in out.new_token_ids]

    with engine(model_dir).start() as eng:
        rid = eng.add_request(PROMPTS[0], GREEDY)
        assert asyncio.run(consume(eng, rid)) == alone[0]
        with pytest.raises(RequestError, match="unknown request id"):
            eng.outputs(rid)


def test_a_step_that_fails_ends_its_requests_and_the_engine_goes_on(model_dir, alone):
    """The runner raising in one step (a broken kernel, say) fails the requests of that step
    with finish reason "error"; their blocks return and later requests run normally."""
    with engine(model_dir).start() as eng:
        execute = eng.core.runner.execute_prepared
        failures = []

        def fail_once(step):
            if not failures:
                failures.append(step.rows)
                raise RuntimeError("kernel failed")
            return execute(step)

        eng.core.runner.execute_prepared = fail_once
        rid = eng.add_request(PROMPTS[0], GREEDY)
        outputs = list(eng.outputs(rid))
        assert outputs[-1].finished and outputs[-1].finish_reason == "error"
        assert "kernel failed" in outputs[-1].error
        assert run_all(eng, PROMPTS[:3]) == alone[:3]
        stats = eng.stats()
    assert stats.blocks_referenced.device == 0
