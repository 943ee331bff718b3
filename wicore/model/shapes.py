"""The published sizes of the Gemma 3 text models, for what runs at a real shape without its
weights: memory plans, benchmarks on random weights (wicore.export.random_weights), tests.

`hf_config(shape, layers)` is a transformers `Gemma3TextConfig` dict of the model's first
`layers` layers (five sliding-window layers, then a full-attention one, repeating).
"""

from __future__ import annotations

PATTERN = 6  # five sliding layers, then a full one

# fmt: off
SHAPES: dict[str, dict[str, int]] = {
    "gemma3-1b": dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=256, query_pre_attn_scalar=256, vocab_size=262144, sliding_window=512, depth=26),
    "gemma3-4b": dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=256, query_pre_attn_scalar=256, vocab_size=262208, sliding_window=1024, depth=34),
    "gemma3-12b": dict(hidden_size=3840, intermediate_size=15360, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, query_pre_attn_scalar=256, vocab_size=262208, sliding_window=1024, depth=48),
    "gemma3-27b": dict(hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
                       head_dim=128, query_pre_attn_scalar=168, vocab_size=262208, sliding_window=1024, depth=62),
}
# fmt: on


def layer_types(layers: int) -> list[str]:
    return ["full_attention" if (i + 1) % PATTERN == 0 else "sliding_attention" for i in range(layers)]


def hf_config(shape: str, layers: int | None = None) -> dict[str, object]:
    """The shape's text config (transformers' Gemma3TextConfig keys) with `layers` layers (None: all)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose from {', '.join(SHAPES)}")
    s = {k: v for k, v in SHAPES[shape].items() if k != "depth"}
    layers = SHAPES[shape]["depth"] if layers is None else layers
    global_rope: dict[str, object] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if shape != "gemma3-1b":
        global_rope = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}
    rope = {"full_attention": global_rope, "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    return dict(
        s, num_hidden_layers=layers, layer_types=layer_types(layers), max_position_embeddings=131072, rope_parameters=rope
    )
