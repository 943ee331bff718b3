"""What fits a memory budget (`wicore plan`): the arithmetic by hand at Gemma-3-27B's shape, and
the engine holding what the plan says it holds on a tiny export."""

from __future__ import annotations

import pytest
from shapes import GEMMA3_27B_TEXT, QWEN3_30B_A3B, SIGLIP_27B

from wicore.devices.placement import partition_weights
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.graph.manifest import Manifest
from wicore.kv.capacity import Workload, activation_bytes, estimate_vision_bytes, estimate_weight_bytes, plan_capacity
from wicore.kv.layout import KVLayout
from wicore.model.config import DecoderConfig
from wicore.model.vision import VisionConfig
from wicore.types.sampling import SamplingParams

GIB = 1 << 30
CFG = DecoderConfig.from_hf(GEMMA3_27B_TEXT)
# Per layer: q and o 5376 x 4096 each, k and v 5376 x 2048 each, the MLP 3 x 5376 x 21504;
# with the tied table (262208 x 5376, also the LM head) 27,007,991,808 linear weights, and
# 62 x (4 x 5376 + 2 x 128) + 5376 = 1,354,496 norm weights.
LINEAR, TABLE, NORMS = 62 * (2 * 5376 * 4096 + 2 * 5376 * 2048 + 3 * 5376 * 21504) + 262208 * 5376, 262208 * 5376, 1_354_496
PAGED = Workload(paged_attention=True)  # chunks of 256, 2048 tokens a step


def test_weights_of_the_27b_in_fp16_and_in_4_bits():
    assert LINEAR == 27_007_991_808
    assert estimate_weight_bytes(CFG, 2) == (LINEAR + NORMS) * 2 == 54_018_692_608  # 50.31 GiB
    # 4-bit codes, an fp16 scale per 32 columns, the embedding's fp16 rows: 16.78 GiB.
    assert estimate_weight_bytes(CFG, 2, 4) == LINEAR // 2 + LINEAR // 32 * 2 + (TABLE + NORMS) * 2 == 18_013_964_800


def test_weights_of_qwen3_30b_a3b_count_every_expert():
    """48 layers of q, o (2048 x 4096 each), k, v (2048 x 512 each) and 128 experts of 3 x 2048 x 768
    with their router rows; the embedding and the untied head 151936 x 2048 each: 30.5B weights,
    the model's size."""
    cfg = DecoderConfig.from_hf(QWEN3_30B_A3B)
    per_layer = 2 * 2048 * 4096 + 2 * 2048 * 512 + 128 * (3 * 2048 * 768 + 2048)
    linear = 48 * per_layer + 2 * 151936 * 2048
    assert linear == 30_531_911_680
    norms = 48 * (4 * 2048 + 2 * 128) + 2048
    assert estimate_weight_bytes(cfg, 2) == (linear + norms) * 2


def test_weight_estimate_is_what_the_exporter_writes(tiny_export):
    """The tiny model: 4 x (64 x 32 x 12 + 3 x 64 x 128) + 512 x 64 = 229,376 weights and
    4 x (4 x 64 + 64) + 64 = 1,344 norm weights, in fp32. The export's initializers hold them and
    a few graph constants (RoPE frequencies, shapes): under 1 KiB more."""
    folder, _ = tiny_export(1)
    manifest = Manifest.read(folder)
    estimate = estimate_weight_bytes(manifest.config, 4)
    assert estimate == (229_376 + 1_344) * 4
    exported = sum(partition_weights(folder, r).total for r in manifest.partitions)
    assert estimate <= exported < estimate + 1024


def test_vision_tower_of_the_27b():
    """SigLIP, 27 layers of width 1152 (q, k, v, out 1152 x 1152 and an MLP of 4304, with biases and
    two layer norms: 15,239,504 each), the patch and position embeddings (1152 x 3 x 14 x 14 + 1152,
    4096 x 1152), the post layer norm, the projector (a norm, 1152 x 5376): 423,060,336 weights."""
    vision = VisionConfig.from_hf({"text_config": {"hidden_size": 5376}, "vision_config": SIGLIP_27B}, {})
    per_layer = 4 * (1152 * 1152 + 1152) + 2 * 2 * 1152 + 2 * 4304 * 1152 + 4304 + 1152
    assert per_layer == 15_239_504
    expected = 27 * per_layer + 1152 * 3 * 14 * 14 + 1152 + 4096 * 1152 + 2 * 1152 + 1152 + 1152 * 5376
    assert estimate_vision_bytes(vision, 2) == expected * 2 == 846_120_672


def test_vision_estimate_is_what_the_exporter_writes(tiny_multimodal):
    """Within 1 KiB: the graph adds a few constants and stores equal small tensors once (the tiny
    tower's biases that start at zero)."""
    folder = tiny_multimodal.export()
    manifest = Manifest.read(folder)
    estimate = estimate_vision_bytes(manifest.vision.config, 4)
    assert abs(partition_weights(folder, manifest.vision).total - estimate) < 1024


def test_kv_pool_of_the_27b_at_128k():
    """10 full-attention layers x 131,072 tokens x 16 KV heads x 128 x K and V x 2 B = 10 GiB (the
    issue's 10.7 GB), in blocks of 16 tokens (1.25 MiB) plus the sink; 52 sliding layers hold their
    window and a prefill chunk, ceil((1024 - 1 + 256) / 16) + 1 = 81 blocks of 6.5 MiB, plus the
    sink: 0.52 GiB. With the paged kernels' 128-token blocks: 1025 and 12 blocks."""
    layout = KVLayout.of_config(CFG, "float16", 16)
    assert (layout.block_bytes(0), layout.block_bytes(1)) == (10 * 2 * 16 * 16 * 128 * 2, 52 * 2 * 16 * 16 * 128 * 2)
    assert layout.pool_bytes(1, 131072, 256) == 8193 * 1_310_720 + 82 * 6_815_744 == 11_297_619_968
    assert KVLayout.of_config(CFG, "float16", 128).pool_bytes(1, 131072, 256) == 1025 * 10_485_760 + 12 * 54_525_952


def test_the_27b_at_128k_fits_an_80_gib_card_in_fp16():
    """Paged attention: 80 GiB - 50.31 GiB of weights leaves 31,880,653,312 B; activations are
    83,624,192 B a 256-token chunk (hidden states 256 x 3 x (5376 + 21504) x 4 B and one row of
    logits), the window 654,311,424 B: (31,880,653,312 - 83,624,192 - 654,311,424) // 10,485,760 =
    2970 blocks, one the sink: 380,032 tokens, more than the model's 131,072. Two sequences of
    131,072 need 2049 full blocks and 23 window blocks (22,739,419,136 B), three 33.7 GB."""
    layout = KVLayout.of_config(CFG, "float16", 128)
    cap = plan_capacity(CFG, layout, "float16", estimate_weight_bytes(CFG, 2), 80 * GIB, 131072, PAGED)
    assert (cap.memory_context, cap.longest, cap.num_sequences) == (380_032, 131072, 2)
    assert (cap.kv_bytes, cap.activations) == (2049 * 10_485_760 + 23 * 54_525_952, 2 * 83_624_192)
    assert (cap.longest_kv, cap.longest_activations) == (1025 * 10_485_760 + 12 * 54_525_952, 83_624_192)  # 61.01 GiB in all


def test_the_27b_in_4_bits_on_a_24_gib_card_reaches_85k_tokens():
    """24 GiB - 16.78 GiB of weights leaves 7,755,838,976 B; less activations and the window,
    7,017,903,360 B hold 669 full blocks of 128 tokens, one the sink: 85,504 tokens. 128K tokens
    of fp16 KV (10.6 GiB) do not fit beside the weights."""
    layout = KVLayout.of_config(CFG, "float16", 128)
    cap = plan_capacity(CFG, layout, "float16", estimate_weight_bytes(CFG, 2, 4), 24 * GIB, 131072, PAGED)
    assert (cap.memory_context, cap.longest, cap.num_sequences) == (85_504, 85_504, 0)


def test_portable_attention_activations_at_128k():
    """A 256-token chunk against 131,072 keys: K and V gathered in fp16 and copied to fp32
    (2 x 131072 x 16 x 128 x 6 B), the scores and probabilities of 32 heads and the mask of 2
    queries a KV head (256 x 131072 x 66 x 4 B), hidden states and one row of logits: 11.33 GiB."""
    expected = 2 * 131072 * 16 * 128 * 6 + 256 * 131072 * 66 * 4 + 83_624_192
    assert activation_bytes(CFG, 2, 1, 256, 131072, paged=False) == expected == 12_163_219_712
    assert activation_bytes(CFG, 2, 1, 256, 131072, paged=True) == 83_624_192


@pytest.mark.parametrize("num_seqs", [1, 3])
def test_the_engine_holds_what_the_plan_says(tiny_export, num_seqs):
    """An engine given the plan's --kv-pool-gb and --max-num-seqs runs `num_seqs` sequences of
    200 tokens at once (the tiny model takes 256) without preempting any."""
    folder, _ = tiny_export(1)
    manifest = Manifest.read(folder)
    layout = KVLayout.of(manifest, 4)
    work = Workload(prefill_chunk=16, max_num_batched_tokens=48)
    cap = plan_capacity(manifest.config, layout, manifest.kv_dtype, 0, 2 << 20, 200, work)
    assert cap.num_sequences >= num_seqs and cap.longest == 256
    pool = layout.pool_bytes(num_seqs, 200, 16)
    assert pool <= cap.kv_bytes
    scheduler = SchedulerConfig(max_num_seqs=num_seqs, prefill_chunk=16, max_num_batched_tokens=48)
    config = EngineConfig(folder, num_threads=1, block_size=4, kv_pool_gb=pool / GIB, host_tier_gb=0, scheduler=scheduler)
    prompts = [[3 + i] * 199 for i in range(num_seqs)]
    with Engine(config) as eng:
        done = eng.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
        stats = eng.stats()
    assert [(d.error, len(d.token_ids)) for d in done] == [(None, 1)] * num_seqs
    assert (stats.preempted_swap, stats.preempted_recompute) == (0, 0)
