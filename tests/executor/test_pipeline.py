"""Micro-batched steps over two partitions (wicore.executor.pipeline): the same tokens and logits
as the whole batch run partition after partition, and only steps long enough are cut."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pytest

from wicore.engine.engine import Engine, EngineConfig
from wicore.executor.batch import build_batch
from wicore.executor.pipeline import Pipeline
from wicore.types.sampling import SamplingParams


def test_only_steps_with_enough_tokens_a_micro_batch_are_cut():
    @dataclass
    class FakeGraphs:
        sessions: tuple[int, ...] = (0, 1)

    pipeline = Pipeline(FakeGraphs(), tokens=512)  # type: ignore[arg-type]
    try:
        row = SimpleNamespace(token_ids=[5], start=0, block_table=[1], window_table=[1], window_first=0, num_logits=1)
        decode = replace(build_batch([row], 4), input_ids=np.zeros((256, 1), np.int64))
        assert pipeline.spans(decode) == [(0, 256)]
        prefill = replace(decode, input_ids=np.zeros((8, 300), np.int64))
        assert pipeline.spans(prefill) == [(0, 2), (2, 4), (4, 6), (6, 8)]
        one_long_row = replace(decode, input_ids=np.zeros((1, 4096), np.int64))
        assert pipeline.spans(one_long_row) == [(0, 1)]
    finally:
        pipeline.close()
    whole = Pipeline(FakeGraphs(), tokens=0)  # type: ignore[arg-type]
    try:  # the workers alone (steps in flight over groups): steps run whole
        assert whole.spans(prefill) == [(0, 8)]
    finally:
        whole.close()
    with pytest.raises(ValueError, match="at least 1 token"):
        Pipeline(FakeGraphs(), tokens=-1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def two_partitions(tiny_export):
    folder, _ = tiny_export(2)
    return folder


# Two pairs of equal lengths: the runner runs rows of one length together, so each pair is a batch to cut.
PROMPTS = [list(range(3, 40)), [11, 12, 13, 14, 15, 16, 17, 18, 19], list(range(50, 87)), [7, 7, 7, 7, 7, 8, 8, 8, 8]]


@pytest.mark.parametrize("micro_batch_tokens", [1, 8])
def test_micro_batches_give_the_whole_batchs_logits_and_tokens(two_partitions, micro_batch_tokens):
    config = EngineConfig(model_dir=two_partitions, devices="cpu,cpu", num_host_blocks=0, num_nvme_blocks=0)
    params = {
        "prompt_logits": SamplingParams(max_tokens=1, prompt_logits=True),
        "greedy": SamplingParams(max_tokens=12, ignore_eos=True),
        "top-k": SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, top_k=20, seed=3),
    }
    results = {}
    for tokens in (0, micro_batch_tokens):
        with Engine(replace(config, micro_batch_tokens=tokens)) as engine:
            pipeline = engine.core.runner.graphs.pipeline
            assert (pipeline is None) == (tokens == 0)
            results[tokens] = {name: engine.generate(PROMPTS, p) for name, p in params.items()}
            if pipeline is not None:  # the prefill steps were cut (and with 1 token, the decode steps too)
                assert pipeline.num_steps >= (2 * 11 if tokens == 1 else 3)  # 11 decode steps a decode
    whole, cut = results[0], results[micro_batch_tokens]
    for a, b in zip(whole["prompt_logits"], cut["prompt_logits"], strict=True):
        np.testing.assert_allclose(b.prompt_logits, a.prompt_logits, rtol=1e-5, atol=1e-5)
    for name in ("greedy", "top-k"):
        assert [c.token_ids for c in cut[name]] == [c.token_ids for c in whole[name]], name


def test_partitions_on_one_device_run_whole_by_default(two_partitions):
    with Engine(EngineConfig(model_dir=two_partitions, devices="cpu", num_host_blocks=0, num_nvme_blocks=0)) as engine:
        assert engine.core.runner.graphs.pipeline is None


def test_a_negative_micro_batch_size_is_refused(two_partitions):
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 0"):
        EngineConfig(model_dir=two_partitions, micro_batch_tokens=-1)
