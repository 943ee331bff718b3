"""Published sizes of mixture-of-experts models, for the shape benchmarks on random weights
(bench_shapes.py --shape qwen3-30b-a3b). wicore.model.shapes holds Gemma 3's.

`hf_config(shape, layers)` is the transformers config class name and its keyword arguments, the
model cut to its first `layers` layers (every layer a routed one, as the published models are).
"""

from __future__ import annotations

# name: (transformers config class, its arguments, depth)
# fmt: off
MOE_SHAPES: dict[str, tuple[str, dict[str, object], int]] = {
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ), 48),
}
# fmt: on


def hf_config(shape: str, layers: int) -> tuple[str, dict[str, object]]:
    cls, kwargs, _ = MOE_SHAPES[shape]
    return cls, dict(kwargs, num_hidden_layers=layers)


def depth(shape: str) -> int:
    return MOE_SHAPES[shape][2]


def active_weight_bytes(shape: str, bytes_per_weight: float) -> float:
    """The weights one token reads: attention, its top-k experts and the router of every layer, and
    the LM head (a batch of many rows reads more experts: this is batch 1's floor)."""
    s = MOE_SHAPES[shape][1]
    h, hd, inter = int(s["hidden_size"]), int(s["head_dim"]), int(s["moe_intermediate_size"])  # type: ignore[call-overload]
    attn = h * hd * (2 * int(s["num_attention_heads"]) + 2 * int(s["num_key_value_heads"]))  # type: ignore[call-overload]
    experts = int(s["num_experts_per_tok"]) * 3 * h * inter + h * int(s["num_experts"])  # type: ignore[call-overload]
    return ((attn + experts) * depth(shape) + h * int(s["vocab_size"])) * bytes_per_weight  # type: ignore[call-overload]
