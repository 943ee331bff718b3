"""Gemma-3-27B-IT's configuration (google/gemma-3-27b-it's config.json: its text config and the
vision tower's size), for the tests that plan memory at the 27B shape without its weights."""

from wicore.model.shapes import SHAPES

_SIZES = {k: v for k, v in SHAPES["gemma3-27b"].items() if k != "depth"}
GEMMA3_27B_TEXT = {  # as the checkpoint's config.json spells it (rope_theta / rope_scaling, not rope_parameters)
    "model_type": "gemma3_text",
    **_SIZES,
    "num_hidden_layers": SHAPES["gemma3-27b"]["depth"],
    "max_position_embeddings": 131072,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}
SIGLIP_27B = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16}
GEMMA3_27B_IT = {  # the multimodal config.json, less the vision tower's settings
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "text_config": GEMMA3_27B_TEXT,
}
# Qwen/Qwen3-30B-A3B's config.json (the keys WiCore reads): 128 experts of width 768, 8 a token.
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
