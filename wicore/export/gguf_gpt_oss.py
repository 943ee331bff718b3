"""gpt-oss's GGUF header (`general.architecture` `gpt-oss`, as llama.cpp's converter writes it) as the
config.json it came from, read by the same code as a Hugging Face folder (wicore.model.hf_families).

    gpt-oss.embedding_length, .block_count, .attention.head_count(_kv), .attention.key_length
    gpt-oss.expert_count, .expert_used_count, .expert_feed_forward_length   the experts
    gpt-oss.attention.sliding_window        layers 0, 2, 4 ... slide (llama.cpp's swa pattern 2, HF's layer_types)
    gpt-oss.rope.freq_base, .rope.scaling.{type, factor, original_context_length, yarn_beta_fast, yarn_beta_slow}

What the header does not hold is what llama.cpp fixes for every gpt-oss, as the released
config.json has it: the clamped SwiGLU's alpha 1.702 and limit 7 (`LLM_FFN_SWIGLU_OAI_MOE`), and
YaRN without truncated correction dims (`truncate: false`).

Tensors, besides the ones every GGUF has (wicore.export.gguf): `blk.N.attn_sinks.weight` (a sink
logit per head), `attn_output.bias`, the router's `ffn_gate_inp.bias`, the experts' biases
`ffn_{gate,up,down}_exps.bias` [E, width], and `post_attention_norm`, which is the norm before the
MLP (Gemma's GGUFs use the name for the norm after attention). The experts are MXFP4 (ggml type
39): blocks of 32 E2M1 values with one E8M0 exponent, every value exactly a float32, which gguf-py
dequantizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wicore.model.config import FULL, SLIDING, DecoderConfig
from wicore.model.families import Family
from wicore.model.hf_families import decoder_config_from_hf

ARCH = "gpt-oss"

# GGUF tensor suffix -> (WiCore name, is an RMSNorm weight): gpt-oss's beyond the shared table
LAYER_NAMES: dict[str, tuple[str, bool]] = {
    "attn_output.bias": ("self_attn.o_proj.bias", False),
    "attn_sinks": ("self_attn.sinks", False),
    "ffn_gate_inp.bias": ("mlp.router.bias", False),
    "post_attention_norm": ("pre_feedforward_layernorm", True),
}


def gpt_oss_config(
    row: Family, field: Callable[[str, Any], Any], need_field: Callable[[str], Any], vocab_size: int, tie_word_embeddings: bool
) -> DecoderConfig:
    """The DecoderConfig of a gpt-oss GGUF: `field(key, default)` reads its header, `need_field(key)`
    a field it must have (ModelSourceError naming it otherwise)."""
    need = lambda key: need_field(f"{ARCH}.{key}")
    num_layers = int(need("block_count"))
    eos = int(field("tokenizer.ggml.eos_token_id", 2))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field(f"{ARCH}.rope.freq_base", 150_000.0))}
    if field(f"{ARCH}.rope.scaling.type", None) == "yarn":
        rope.update(
            rope_type="yarn",
            factor=float(need("rope.scaling.factor")),
            original_max_position_embeddings=int(need("rope.scaling.original_context_length")),
            beta_fast=float(field(f"{ARCH}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(field(f"{ARCH}.rope.scaling.yarn_beta_slow", 1.0)),
            truncate=False,
        )
    cfg = {
        "model_type": "gpt_oss",
        "vocab_size": vocab_size,
        "hidden_size": int(need("embedding_length")),
        "intermediate_size": int(need("expert_feed_forward_length")),
        "num_hidden_layers": num_layers,
        "num_attention_heads": int(need("attention.head_count")),
        "num_key_value_heads": int(need("attention.head_count_kv")),
        "head_dim": int(need("attention.key_length")),
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)],
        "rope_parameters": rope,
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "num_local_experts": int(need("expert_count")),
        "num_experts_per_tok": int(need("expert_used_count")),
        "attention_bias": True,
        "hidden_act": "silu",
        "bos_token_id": field("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": eos,
        "pad_token_id": field("tokenizer.ggml.padding_token_id", eos),
        "tie_word_embeddings": tie_word_embeddings,
    }
    return decoder_config_from_hf(DecoderConfig, row, cfg)
