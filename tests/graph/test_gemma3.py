"""The decoder graphs against HF transformers on tiny random Gemma 3 models (seconds each)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from batch_rows import Row

from wicore.devices.placement import plan_placement
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.executor.batch import build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers
from wicore.types.sampling import SamplingParams

PROMPT = np.random.default_rng(0).integers(0, 512, 40).tolist()  # 40 tokens: 5x the sliding window


def engine(folder: Path, block_size: int = 4, prefill_chunk: int = 256, **overrides: object) -> Engine:
    """An engine on a tiny export: 64 device blocks, no lower tiers, `prefill_chunk` tokens a step."""
    settings: dict[str, object] = dict(
        model_dir=folder,
        num_threads=1,
        block_size=block_size,
        num_device_blocks=64,
        num_host_blocks=0,
        num_nvme_blocks=0,
        scheduler=SchedulerConfig(prefill_chunk=prefill_chunk),
    )
    return Engine(EngineConfig(**{**settings, **overrides}))


def prompt_logits(eng: Engine, ids: list[int]) -> np.ndarray:
    """Logits at every position of `ids` [len, vocab]."""
    (completion,) = eng.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
    assert completion.error is None, completion.error
    return completion.prompt_logits


def token_ids(eng: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    completions = eng.generate(prompts, params)
    assert [c.error for c in completions] == [None] * len(prompts)
    return [c.token_ids for c in completions]


def graphs(folder: Path, cache: CacheConfig) -> ModelGraphs:
    """The graphs of an export on the CPU, bound to new zero-filled KV buffers of `cache`."""
    manifest = Manifest.read(folder)
    devices = plan_placement(folder, manifest, "cpu").devices
    return ModelGraphs(folder, manifest, KVBuffers(manifest, cache, devices), devices, num_threads=1)


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_logits_at_every_position_match_hf(tiny_export, reference_logits, partitions, block_size):
    folder, model = tiny_export(partitions)
    with engine(folder, block_size=block_size, prefill_chunk=7) as eng:
        ours = prompt_logits(eng, PROMPT)
        assert eng.num_steps == 6  # chunks of 7, 7, 7, 7, 7 and 5 tokens
    ref = reference_logits(model, PROMPT)
    assert ours.shape == (40, 512)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_key_value_heads": 1},  # multi-query, like the 270M
        {"num_key_value_heads": 4},  # plain multi-head
        {"final_logit_softcapping": 5.0},
        {"sliding_window": 3, "query_pre_attn_scalar": 17},
    ],
    ids=["mqa", "mha", "softcap", "window3"],
)
def test_config_variants_match_hf(tiny_export, reference_logits, overrides):
    folder, model = tiny_export(1, **overrides)
    with engine(folder, prefill_chunk=9) as eng:
        ours = prompt_logits(eng, PROMPT)
    np.testing.assert_allclose(ours, reference_logits(model, PROMPT), atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    ("prefill_chunk", "length", "num_steps"),
    [(13, 40, 4), (256, 1, 1)],  # chunks of 13, 13, 13 and 1 tokens; a one-token prompt
    ids=["last-chunk-of-one", "one-token-prompt"],
)
def test_prompt_logits_of_one_token_chunks_match_hf(tiny_export, reference_logits, prefill_chunk, length, num_steps):
    folder, model = tiny_export(1)
    with engine(folder, prefill_chunk=prefill_chunk) as eng:
        ours = prompt_logits(eng, PROMPT[:length])
        assert eng.num_steps == num_steps
    assert ours.shape == (length, 512)
    np.testing.assert_allclose(ours, reference_logits(model, PROMPT[:length]), atol=2e-5, rtol=0)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("prompt_len", [16, 17, 15])  # ends on, just past and just before a block boundary
def test_greedy_decode_matches_hf_around_block_boundaries(tiny_export, prompt_len):
    folder, model = tiny_export(1)
    ids = PROMPT[:prompt_len]
    with engine(folder, block_size=8, prefill_chunk=8) as eng:
        (out,) = eng.generate([ids], SamplingParams(max_tokens=20, ignore_eos=True))
    assert out.token_ids == hf_greedy(model, ids, 20)
    assert out.finish_reason == "length"
    assert out.num_prompt_tokens == prompt_len


def test_non_contiguous_block_table_and_sink(tiny_export, reference_logits):
    """Blocks out of order, the sink block untouched by a real row, padding rows in one step."""
    folder, model = tiny_export(1)
    g = graphs(folder, CacheConfig(num_blocks=16, block_size=4))
    long, short = [9, 3, 14, 6], [1, 12]
    logits = g.run(build_batch([Row(PROMPT[:13], 0, long), Row(PROMPT[20:25], 0, short)], block_size=4)).logits

    assert logits.shape == (2, 512)
    np.testing.assert_allclose(logits[0], reference_logits(model, PROMPT[:13])[-1], atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits[1], reference_logits(model, PROMPT[20:25])[-1], atol=2e-5, rtol=0)
    # The buffers were written in place, in the blocks each row owns: the 13th token of
    # `long` is slot 0 of block 6, the 5th of `short` slot 0 of block 12.
    for layer in range(g.buffers.num_layers):
        for pool in g.buffers.arrays(layer):
            assert pool.shape == (16, 4, 2, 32)
            assert all(pool[b].any(axis=(1, 2)).all() for b in (9, 3, 14, 1))
            assert pool[6, 0].any() and pool[12, 0].any()
            assert not pool[6, 1:].any() and not pool[12, 1:].any()
            assert not pool[[2, 4, 5, 7, 8, 10, 11, 13, 15]].any()

    # Decode one token for each row against what the cache now holds.
    logits = g.run(build_batch([Row([7], 13, long), Row([7], 5, short)], block_size=4)).logits
    np.testing.assert_allclose(logits[0], reference_logits(model, PROMPT[:13] + [7])[-1], atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits[1], reference_logits(model, PROMPT[20:25] + [7])[-1], atol=2e-5, rtol=0)


def test_batch_generates_what_each_generates_alone(tiny_export):
    """Four prompts prefilled together in chunks of 6, then decoded together, against each
    alone (no prefix cache: the lone runs compute every token again)."""
    folder, _ = tiny_export(2)
    prompts = [PROMPT[:3], PROMPT[:17], PROMPT[5:30], PROMPT[30:31]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    with engine(folder, prefill_chunk=6, enable_prefix_cache=False) as eng:
        together = token_ids(eng, prompts, params)
        alone = [token_ids(eng, [p], params)[0] for p in prompts]
    assert together == alone
    assert all(len(t) == 12 for t in together)


def test_seeded_sampling_is_repeatable_and_batch_independent(tiny_export):
    folder, _ = tiny_export(1)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    with engine(folder, enable_prefix_cache=False) as eng:
        first = token_ids(eng, [PROMPT[:10]], params)[0]
        again = token_ids(eng, [PROMPT[:10], PROMPT[:20]], params)[0]
        other_seed = token_ids(eng, [PROMPT[:10]], dataclasses.replace(params, seed=99))[0]
    assert len(first) == 16
    assert first == again
    assert first != other_seed


def test_fp16_export_tracks_fp32(tiny_export, reference_logits):
    folder, model = tiny_export(1, dtype="fp16")
    manifest = Manifest.read(folder)
    assert manifest.dtype == "fp16" and manifest.kv_dtype == "float16"
    with engine(folder) as eng:
        ours = prompt_logits(eng, PROMPT)
    ref = reference_logits(model, PROMPT)
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() < 2e-2 * scale
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_attention_mass_per_block_matches_hf_attention_probs(tiny_model, tmp_path):
    """--attention-stats: each block's mass is the HF attention probability on its keys,
    summed over the full-attention layers (layer 2 of 4 here), heads and queries. The first
    partition (layers 0-1) has sliding layers only and reports zeros."""
    import torch

    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    folder, model = tiny_model()
    out = tmp_path / "stats"
    export_model(open_source(str(folder)), out, ExportConfig(num_partitions=2, attention_stats=True), progress=lambda _: None)
    assert Manifest.read(out).has_attention_stats
    g = graphs(out, CacheConfig(num_blocks=8, block_size=4))
    result = g.run(build_batch([Row(PROMPT[:10], 0, [5, 2, 7])], block_size=4))

    with torch.no_grad():
        attentions = model(torch.tensor([PROMPT[:10]]), output_attentions=True).attentions
    per_key = attentions[2][0].sum(dim=(0, 1)).numpy()  # [10 keys]
    expected = np.add.reduceat(np.pad(per_key, (0, 2)), [0, 4, 8])  # keys 0-3, 4-7, 8-9 by block
    assert result.attention_mass.shape == (1, 3)
    np.testing.assert_allclose(result.attention_mass[0], expected, rtol=1e-5)
    assert result.attention_mass.sum() == pytest.approx(1 * 4 * 10)  # full layers * heads * queries


def test_sliding_layers_read_only_their_window_blocks(tiny_export, reference_logits):
    """The sliding layers' buffers hold 5 usable blocks, reused as a ring as the window
    (8 tokens) moves over a 40-token prompt; blocks outside the window are filled with large
    garbage before every step, so reading any of them would wreck the logits. (Garbage, not
    NaN: the unwritten tail of a live block is read and masked, and 0 x NaN is NaN.)"""
    folder, model = tiny_export(2)
    manifest = Manifest.read(folder)
    block_size, window, ring = 4, 8, [3, 1, 5, 2, 4]
    g = graphs(folder, CacheConfig(num_blocks=12, block_size=block_size, num_window_blocks=6))
    full_blocks = [11, 2, 7, 4, 9, 1, 10, 3, 6, 8]  # out of order, 40 tokens
    ref = reference_logits(model, PROMPT)
    sliding = [i for i in range(manifest.config.num_layers) if manifest.config.is_sliding(i)]
    for start in range(0, 40, 6):
        n = min(6, 40 - start)
        first = max(0, (start - window + 1) // block_size)
        last = (start + n - 1) // block_size
        live = {ring[i % len(ring)] for i in range(first, last + 1)}
        for layer in sliding:
            for pool in g.buffers.arrays(layer):
                pool[[b for b in ring if b not in live]] = 1e3
        row = Row(
            PROMPT[start : start + n],
            start,
            full_blocks[: last + 1],
            [ring[i % len(ring)] for i in range(first, last + 1)],
            first,
            num_logits=n,
        )
        logits = g.run(build_batch([row], block_size)).logits
        np.testing.assert_allclose(logits, ref[start : start + n], atol=2e-5, rtol=0)
    assert g.buffers.arrays(sliding[0])[0].shape[0] == 6 and g.buffers.arrays(2)[0].shape[0] == 12
