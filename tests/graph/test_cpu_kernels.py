"""graph/cpu_kernels.py: which layers of the CPU graphs take wicore.BlockAttentionQKV, the prologue inside the op
(the op's arithmetic: tests/kernels/test_cpu_attention_qkv.py; an export's tokens: tests/kernels/test_matmul_q_export.py)."""

from __future__ import annotations

from wicore.graph.cpu_kernels import MAX_ROPE_CACHE_BYTES, fuses_prologue
from wicore.model.config import FULL, SLIDING, DecoderConfig, RopeConfig


def config(family: str = "llama", positions: int = 512, head_dim: int = 64, rope: RopeConfig | None = None) -> DecoderConfig:
    return DecoderConfig(
        vocab_size=64,
        hidden_size=256,
        intermediate_size=512,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=head_dim,
        layer_types=(FULL, SLIDING),
        sliding_window=8,
        rope_global=rope or RopeConfig(10_000.0),
        max_position_embeddings=positions,
        family=family,
    )


def test_full_layers_with_small_rope_caches_fuse():
    assert fuses_prologue(config(), is_sliding=False)  # a tiny GGUF's: 128 KB of caches
    assert not fuses_prologue(config(), is_sliding=True)  # the window's tables are not the op's
    assert fuses_prologue(config(positions=8192), is_sliding=False)  # SmolLM2's shape: 2 MB
    assert fuses_prologue(config("qwen3"), is_sliding=False)  # per-head q/k norms: the op's own
    assert not fuses_prologue(config("olmo2"), is_sliding=False)  # a norm over the whole projection


def test_the_caches_size_rule():
    rows = MAX_ROPE_CACHE_BYTES // (2 * 32 * 4)  # cos and sin, head_dim / 2 = 32 float32 a row
    assert fuses_prologue(config(positions=rows), is_sliding=False)
    assert not fuses_prologue(config(positions=rows + 1), is_sliding=False)
    assert not fuses_prologue(config("gemma3", positions=32768, head_dim=256), is_sliding=False)  # 32 MB


def test_longrope_keeps_its_per_step_tables():
    longrope = RopeConfig(10_000.0, short_factor=(1.0,) * 32, long_factor=(2.0,) * 32, original_max_position_embeddings=256)
    assert not fuses_prologue(config(rope=longrope), is_sliding=False)
