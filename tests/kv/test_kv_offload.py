"""Offloaded steps (wicore.kv.offload): sequences whose full-attention KV does not fit the
device tier run from the device and host tiers, their blocks staged around each partition. On a
tiny random Gemma 3 with two full-attention layers: the tokens are HF transformers' (exact
attention), with one stage shared by two partitions or one stage a layer."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.blocks.tier import Tier
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.stats import TierCounts
from wicore.errors import ContextLengthError
from wicore.kv.offload import plan_stage
from wicore.types.sampling import SamplingParams
from wicore.types.step import ScheduledRow

D, H = Tier.DEVICE, Tier.HOST
TWO_FULL = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
RNG = np.random.default_rng(11)
LONG = RNG.integers(3, 512, 70).tolist()  # 18 blocks of 4 with the tokens generated
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def row(request_id: str, start: int, n: int, table: list[int], locations: tuple = ()) -> ScheduledRow:
    return ScheduledRow(request_id, [7] * n, start, table, [], [], 0, 1, True, GREEDY, full_locations=locations)


def test_plan_stage_gathers_device_blocks_after_the_sink_then_copies_host_blocks_and_sends_written_blocks_home():
    """Row a (offloaded: HOST 5, DEVICE 2, DEVICE 9) decodes its token 9, in its third block; row b
    (on DEVICE: 4, 6) prefills tokens 3..6, its blocks 0 and 1. Stage frames: the sink 0, the DEVICE
    blocks 1-4 in row order (2, 9, 4, 6), the HOST block 5."""
    rows = [row("a", 9, 1, [], ((H, 5), (D, 2), (D, 9))), row("b", 3, 4, [4, 6])]
    plan = plan_stage(rows, 4, 8, has_window=True)
    assert [r.block_table for r in plan.rows] == [[5, 1, 2], [3, 4]]
    assert all(r.full_locations == () for r in plan.rows)
    assert (plan.device_src.tolist(), plan.host_src.tolist(), plan.num_frames) == ([0, 2, 9, 4, 6], [5], 6)
    assert (plan.back_device_src.tolist(), plan.back_device_dst.tolist()) == ([2, 3, 4], [9, 4, 6])
    assert (plan.back_host_src.tolist(), plan.back_host_dst.tolist()) == ([], [])
    prefill = plan_stage([row("c", 0, 6, [], ((H, 3), (D, 7)))], 4, 8, has_window=True)  # writes both its blocks
    assert [r.block_table for r in prefill.rows] == [[2, 1]]
    assert (prefill.back_host_src.tolist(), prefill.back_host_dst.tolist()) == ([2], [3])
    no_window = plan_stage(rows, 4, 8, has_window=False)  # the full table is the window table too
    assert [(r.window_table, r.window_first) for r in no_window.rows] == [([5, 1, 2], 0), ([3, 4], 0)]
    with pytest.raises(ValueError, match="the rows stage 5 blocks, the stage holds 4"):
        plan_stage(rows, 4, 5, has_window=True)


def test_plan_stage_stages_a_shared_block_once_and_host_blocks_in_frame_order():
    """Rows a and b share a prefix (HOST 9, HOST 4, DEVICE 2) and each decode in a block of its own
    (a: DEVICE 5, b: HOST 7). Stage frames: the sink 0, DEVICE 2 and 5, then HOST 4, 7, 9 by frame
    (consecutive host frames are one slice to copy in); the shared blocks are staged once."""
    rows = [row("a", 13, 1, [], ((H, 9), (H, 4), (D, 2), (D, 5))), row("b", 12, 1, [], ((H, 9), (H, 4), (D, 2), (H, 7)))]
    plan = plan_stage(rows, 4, 6, has_window=True)
    assert [r.block_table for r in plan.rows] == [[5, 3, 1, 2], [5, 3, 1, 4]]
    assert (plan.device_src.tolist(), plan.host_src.tolist(), plan.num_frames) == ([0, 2, 5], [4, 7, 9], 6)
    assert (plan.back_device_src.tolist(), plan.back_device_dst.tolist()) == ([2], [5])
    assert (plan.back_host_src.tolist(), plan.back_host_dst.tolist()) == ([4], [7])


@pytest.fixture(scope="module")
def tiny(tiny_export):
    return {parts: tiny_export(parts, layer_types=TWO_FULL) for parts in (1, 2)}


def offloaded_engine(model_dir, **overrides) -> Engine:
    """Full-attention layers' device tier: 6 blocks (the sink and 5, 20 tokens); the host tier
    64; steps stage up to 128 tokens."""
    settings = dict(
        num_threads=1,
        block_size=4,
        num_device_blocks=6,
        num_window_device_blocks=32,
        num_host_blocks=64,
        num_nvme_blocks=0,
        kv_offload_tokens=128,
        scheduler=SchedulerConfig(max_num_batched_tokens=48, prefill_chunk=16),
    )
    return Engine(EngineConfig(model_dir=model_dir, **{**settings, **overrides}))


@pytest.mark.parametrize("parts", [2, 1])
def test_a_sequence_past_the_device_tier_is_offloaded_and_gives_hfs_greedy_tokens(tiny, parts, reference_greedy):
    """70 prompt tokens and 12 generated need 21 blocks; the device tier holds 5. Two partitions
    with a full layer each share one stage; one partition has a stage a layer. Both give HF's
    tokens; the host blocks were staged at every step."""
    model_dir, model = tiny[parts]
    with offloaded_engine(model_dir) as engine:
        assert engine.max_sequence_tokens == 128  # the stage, less the sink: 32 blocks of 4
        assert engine.core.runner.offloader is not None and engine.core.runner.offloader.num_stages == 3 - parts
        got = engine.generate([LONG], GREEDY)[0]
        stats = engine.core.runner.offloader.stats
        full = engine.stats().kv_groups["full"].blocks_in_use
    assert got.token_ids == reference_greedy(model, LONG, 12)
    # and those tokens hang on the prompt's first 60, whose KV lay in the host tier: other first
    # tokens (the last 10 kept) give other greedy tokens, so a stage that lost them would show
    other_start = np.random.default_rng(7).integers(3, 512, 60).tolist()
    assert reference_greedy(model, other_start + LONG[60:], 12) != got.token_ids
    assert stats.num_runs == 5 + 11  # 70 tokens in chunks of 16, then 11 decode steps
    assert stats.num_host_blocks > 0 and stats.num_written_back > 0
    # 81 tokens have KV: 20 full blocks stay cached where they lie, the partial 21st is retired
    assert full == TierCounts(device=4, host=16, nvme=0)


def test_offloaded_sequences_share_a_prefix_from_host_and_run_beside_short_ones(tiny, reference_greedy):
    """Two requests with the same long prompt (the second reuses its 17 cached blocks, most of them
    on HOST) and a short one, together: each gives its tokens alone."""
    model_dir, model = tiny[2]
    short = RNG.integers(3, 512, 9).tolist()
    with offloaded_engine(model_dir) as engine:
        first = engine.generate([LONG], GREEDY)[0]
        both = engine.generate([LONG, short], GREEDY)
        cached = engine.stats().cached_prompt_tokens
    assert first.token_ids == both[0].token_ids == reference_greedy(model, LONG, 12)
    assert both[1].token_ids == reference_greedy(model, short, 12)
    assert cached == 68  # 17 full blocks of the 70-token prompt


def test_a_prompt_past_what_a_step_stages_is_refused(tiny):
    """128 tokens and one to generate are 33 blocks; a step stages 32: refused, naming the flags."""
    model_dir, _ = tiny[2]
    with (
        offloaded_engine(model_dir) as engine,
        pytest.raises(ContextLengthError, match="the prompt has 128 tokens; a step stages 128"),
    ):
        engine.add_request(RNG.integers(3, 512, 128).tolist(), GREEDY)


def test_a_model_without_sliding_layers_offloads_its_table_as_the_window_table_too(tmp_path, reference_greedy):
    """A tiny Llama (three full-attention layers, one partition: a stage a layer) gives HF's tokens
    offloaded; its graphs read the staged table for their (unused) window inputs as well."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    export_model(open_source(str(tmp_path / "hf")), tmp_path / "model", ExportConfig(), progress=lambda _: None)
    with offloaded_engine(tmp_path / "model", num_window_device_blocks=None) as engine:
        assert engine.core.runner.offloader is not None and engine.core.runner.offloader.num_stages == 3
        got = engine.generate([LONG], GREEDY)[0]
        assert engine.core.runner.offloader.stats.num_host_blocks > 0
    assert got.token_ids == reference_greedy(model, LONG, 12)


def test_the_copy_graphs_of_accelerators_stage_the_same_blocks(tiny, reference_greedy, monkeypatch):
    """The path a GPU takes (a gather graph fills a stage's first frames, copies bound at the stage's
    addresses bring the host blocks in, two blocks a piece, and block copies write back), run here
    on the CPU EP: HF's tokens, host blocks written back too."""
    from wicore.kv import device_store
    from wicore.kv.offload import KVOffloader

    monkeypatch.setattr(device_store, "HOST_PIECE_BYTES", 2 * 4 * 2 * 32 * 4)  # two blocks: 4 tokens, 2 heads of 32, fp32

    model_dir, model = tiny[2]
    with offloaded_engine(model_dir) as engine:
        numpy_path = engine.core.runner.offloader
        assert numpy_path is not None
        offloader = KVOffloader(
            engine.manifest, engine.core.runner.graphs.buffers, numpy_path.host, numpy_path.num_frames, 1, True
        )
        engine.core.runner.offloader = offloader
        got = engine.generate([LONG], GREEDY)[0]
    assert got.token_ids == reference_greedy(model, LONG, 12)
    assert offloader.stats.num_host_blocks > 0 and offloader.stats.num_written_back > 0


@pytest.mark.parametrize(
    "host_frames, part_bytes",
    [([3, 4, 5], 16 << 20), ([7, 2, 9], 16 << 20), ([7, 2, 9, 12, 30], 64)],
    ids=["consecutive", "scattered", "scattered-in-threads-and-pieces"],
)
def test_the_copy_graphs_stage_host_blocks_from_one_slice_or_gathered(tiny, host_frames, part_bytes, monkeypatch):
    """Consecutive host frames go to the stage as one slice of the host tier, others gathered first
    (a large gather in parts, by threads), then copied in (a large copy in pieces): either way each
    full layer's stage holds the sink, the device blocks, then the host blocks by frame."""
    from wicore.kv import device_store
    from wicore.kv import offload as kv_offload
    from wicore.kv.offload import KVOffloader

    monkeypatch.setattr(kv_offload, "GATHER_PART_BYTES", part_bytes)
    monkeypatch.setattr(device_store, "HOST_PIECE_BYTES", 2 * part_bytes)  # the third case: a block a piece
    model_dir, _ = tiny[1]
    with offloaded_engine(model_dir) as engine:
        buffers, host = engine.core.runner.graphs.buffers, engine.core.runner.offloader.host
        offloader = KVOffloader(engine.manifest, buffers, host, engine.core.runner.offloader.num_frames, 1, True)
        host.data[...] = RNG.standard_normal(host.data.shape).astype(host.data.dtype)
        for layer in (0, 2):  # TWO_FULL's full-attention layers
            for pool in buffers.arrays(layer):
                pool[...] = RNG.standard_normal(pool.shape).astype(pool.dtype)
        plan = offloader.run([row("a", 13, 1, [], tuple((H, f) for f in host_frames) + ((D, 4),))], 4).plan
        offloader.stage(0, plan)
        for k, layer in enumerate((0, 2)):
            for j in range(2):
                expected = np.concatenate([buffers.arrays(layer)[j][[0, 4]], host.layer(k)[j][sorted(host_frames)]])
                np.testing.assert_array_equal(offloader.values(layer)[j].numpy()[: plan.num_frames], expected)


def test_stages_that_leave_the_pool_no_room_are_refused_naming_the_settings(tiny):
    from wicore.errors import WiCoreError

    model_dir, _ = tiny[2]
    config = EngineConfig(model_dir=model_dir, num_threads=1, block_size=4, kv_pool_gb=0.01, kv_offload_tokens=1_000_000)
    with pytest.raises(WiCoreError, match="raise kv_pool_gb or lower kv_offload_tokens"):
        Engine(config)
