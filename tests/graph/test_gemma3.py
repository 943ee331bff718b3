"""The decoder graphs against HF transformers on tiny random Gemma 3 models (seconds each)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from wicore.graph.manifest import Manifest
from wicore.runtime.generator import Generator, Sequence, sequence_row
from wicore.runtime.session import build_step
from wicore.runtime.sampler import Sampler, SamplingParams
from wicore.runtime.session import CacheConfig, ModelRunner

PROMPT = np.random.default_rng(0).integers(0, 512, 40).tolist()  # 40 tokens: 5x the sliding window


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_logits_at_every_position_match_hf(tiny_export, reference_logits, partitions, block_size):
    folder, model = tiny_export(partitions)
    gen = Generator.load(folder, num_threads=1, block_size=block_size, prefill_chunk=7)
    ours = gen.prompt_logits(PROMPT)
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
    gen = Generator.load(folder, num_threads=1, block_size=4, prefill_chunk=9)
    ours, ref = gen.prompt_logits(PROMPT), reference_logits(model, PROMPT)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=0)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("prompt_len", [16, 17, 15])  # ends on, just past and just before a block boundary
def test_greedy_decode_matches_hf_around_block_boundaries(tiny_export, prompt_len):
    folder, model = tiny_export(1)
    gen = Generator.load(folder, num_threads=1, block_size=8, prefill_chunk=8)
    ids = PROMPT[:prompt_len]
    out = gen.generate([ids], SamplingParams(max_tokens=20, ignore_eos=True))
    assert out.token_ids[0] == hf_greedy(model, ids, 20)
    assert out.finish_reasons == ["length"]


def test_non_contiguous_block_table_and_sink(tiny_export, reference_logits):
    """Blocks out of order, the sink block untouched by a real row, padding rows in one step."""
    folder, model = tiny_export(1)
    manifest = Manifest.read(folder)
    runner = ModelRunner(folder, manifest, CacheConfig(num_blocks=16, block_size=4), num_threads=1)
    long = Sequence(list(PROMPT[:13]), 13, Sampler(SamplingParams()), block_ids=[9, 3, 14, 6])
    short = Sequence(list(PROMPT[20:25]), 5, Sampler(SamplingParams()), block_ids=[1, 12])
    logits = runner.run(build_step([sequence_row(long, 13), sequence_row(short, 5)], block_size=4)).logits

    assert logits.shape == (2, 512)
    np.testing.assert_allclose(logits[0], reference_logits(model, PROMPT[:13])[-1], atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits[1], reference_logits(model, PROMPT[20:25])[-1], atol=2e-5, rtol=0)
    # The pools were written in place, in the blocks each row owns: the 13th token of
    # `long` is slot 0 of block 6, the 5th of `short` slot 0 of block 12.
    for pools in (runner.key_pools, runner.value_pools):
        for pool in pools:
            assert all(pool[b].any(axis=(1, 2)).all() for b in (9, 3, 14, 1))
            assert pool[6, 0].any() and pool[12, 0].any()
            assert not pool[6, 1:].any() and not pool[12, 1:].any()
            assert not pool[[2, 4, 5, 7, 8, 10, 11, 13, 15]].any()

    # Decode one token for each row against what the cache now holds.
    for seq, n in ((long, 13), (short, 5)):
        seq.num_computed = n
        seq.token_ids.append(7)
    logits = runner.run(build_step([sequence_row(long, 1), sequence_row(short, 1)], block_size=4)).logits
    np.testing.assert_allclose(logits[0], reference_logits(model, PROMPT[:13] + [7])[-1], atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits[1], reference_logits(model, PROMPT[20:25] + [7])[-1], atol=2e-5, rtol=0)


def test_batch_generates_what_each_generates_alone(tiny_export):
    folder, _ = tiny_export(2)
    gen = Generator.load(folder, num_threads=1, block_size=4, prefill_chunk=6)
    prompts = [PROMPT[:3], PROMPT[:17], PROMPT[5:30], PROMPT[30:31]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    together = gen.generate(prompts, params).token_ids
    alone = [gen.generate([p], params).token_ids[0] for p in prompts]
    assert together == alone
    assert all(len(t) == 12 for t in together)


def test_seeded_sampling_is_repeatable_and_batch_independent(tiny_export):
    folder, _ = tiny_export(1)
    gen = Generator.load(folder, num_threads=1, block_size=4)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    first = gen.generate([PROMPT[:10]], params).token_ids[0]
    again = gen.generate([PROMPT[:10], PROMPT[:20]], params).token_ids[0]
    other_seed = gen.generate([PROMPT[:10]], SamplingParams(**{**params.__dict__, "seed": 99})).token_ids[0]
    assert first == again
    assert first != other_seed


def test_fp16_export_tracks_fp32(tiny_export, reference_logits):
    folder, model = tiny_export(1, dtype="fp16")
    manifest = Manifest.read(folder)
    assert manifest.dtype == "fp16" and manifest.kv_dtype == "float16"
    gen = Generator.load(folder, num_threads=1, block_size=4)
    ours, ref = gen.prompt_logits(PROMPT), reference_logits(model, PROMPT)
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
    manifest = Manifest.read(out)
    assert manifest.has_attention_stats
    runner = ModelRunner(out, manifest, CacheConfig(num_blocks=8, block_size=4), num_threads=1)
    seq = Sequence(list(PROMPT[:10]), 10, Sampler(SamplingParams()), block_ids=[5, 2, 7])
    result = runner.run(build_step([sequence_row(seq, 10)], block_size=4))

    with torch.no_grad():
        attentions = model(torch.tensor([PROMPT[:10]]), output_attentions=True).attentions
    per_key = attentions[2][0].sum(dim=(0, 1)).numpy()  # [10 keys]
    expected = np.add.reduceat(np.pad(per_key, (0, 2)), [0, 4, 8])  # keys 0-3, 4-7, 8-9 by block
    assert result.attention_mass.shape == (1, 3)
    np.testing.assert_allclose(result.attention_mass[0], expected, rtol=1e-5)
    assert result.attention_mass.sum() == pytest.approx(1 * 4 * 10)  # full layers * heads * queries


@dataclass(frozen=True)
class WindowRow:
    token_ids: list[int]
    start: int
    block_table: list[int]
    window_table: list[int]
    window_first: int
    needs_logits: bool = True


def test_sliding_layers_read_only_their_window_blocks(tiny_export, reference_logits):
    """The sliding layers' pool holds 5 usable blocks, reused as a ring as the window
    (8 tokens) moves over a 40-token prompt; blocks outside the window are filled with large
    garbage before every step, so reading any of them would wreck the logits. (Garbage, not
    NaN: the unwritten tail of a live block is read and masked, and 0 x NaN is NaN.)"""
    folder, model = tiny_export(2)
    manifest = Manifest.read(folder)
    block_size, window, ring = 4, 8, [3, 1, 5, 2, 4]
    runner = ModelRunner(folder, manifest, CacheConfig(num_blocks=12, block_size=block_size, num_window_blocks=6), num_threads=1)
    full_blocks = [11, 2, 7, 4, 9, 1, 10, 3, 6, 8]  # out of order, 40 tokens
    ref = reference_logits(model, PROMPT)
    sliding = [i for i in range(manifest.config.num_layers) if manifest.config.is_sliding(i)]
    for start in range(0, 40, 6):
        n = min(6, 40 - start)
        first = max(0, (start - window + 1) // block_size)
        last = (start + n - 1) // block_size
        live = {ring[i % len(ring)] for i in range(first, last + 1)}
        for layer in sliding:
            for pool in (runner.key_pools[layer], runner.value_pools[layer]):
                pool[[b for b in ring if b not in live]] = 1e3
        row = WindowRow(PROMPT[start : start + n], start, full_blocks[: last + 1],
                        [ring[i % len(ring)] for i in range(first, last + 1)], first)
        logits = runner.run(build_step([row], block_size, all_logits=True)).logits
        np.testing.assert_allclose(logits, ref[start : start + n], atol=2e-5, rtol=0)
    assert runner.key_pools[sliding[0]].shape[0] == 6 and runner.key_pools[2].shape[0] == 12
