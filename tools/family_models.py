"""The tiny random models of every decoder family that tools/check_families_gpu.py runs on the CUDA EP:
their HF configs (FAMILIES, at one small SHAPE), the saved checkpoint with its id tokenizer, and how
far TF32 alone moves HF float32's logits (`--tf32-emulation`: the bounds of MAX_ABS_DIFF_OF)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from family_serving import write_id_tokenizer

SHAPE = dict(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5,
)  # fmt: skip
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 50_000.0, "tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1_000_000.0}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_theta": 1_000_000.0, "tie_word_embeddings": True}),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "sliding_window": 64,
            "query_pre_attn_scalar": 64,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
    ),
}
# issue 33's families (tests/graph/test_families.py, test_moe.py; their paged graphs through NumPy
# versions of the contrib ops: tests/graph/test_paged_families.py)
HALF = SHAPE["head_dim"] // 2
FAMILIES |= {
    # the op's softcap; query_pre_attn_scalar's scale; its window on alternate layers
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"sliding_window": 64, "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    ),
    # a window on every layer (the op's local window on the full-attention layers)
    "mistral-sliding": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 64, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1}),
    # LongRoPE rotated before the op (RotaryEmbedding, the factors picked per row): the 700-token
    # prompt is past original_max_position_embeddings (long factors), the others inside (short);
    # --serve's 500-token prompt crosses it while generating (recomputed, as HF does; at this shape
    # the short-factor keys did not change the greedy text either: tests/graph/test_families.py shows it)
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "pad_token_id": 0,
            "eos_token_id": 2,
            "bos_token_id": 1,
            "original_max_position_embeddings": 512,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0 + 0.05 * i for i in range(HALF)],
                "long_factor": [1.0 + 0.6 * i for i in range(HALF)],
            },
        },
    ),
    # q/k norms over the whole projection, before the op
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {"embedding_multiplier": 6.0, "residual_multiplier": 0.3, "attention_multiplier": 0.2, "logits_scaling": 4.0},
    ),
    # the paged exports run the experts in com.microsoft.MoE
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128},
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 8, "num_experts_per_tok": 2}),
    # sinks (the op's head_sink, drawn with std 1 so they matter), biases, clamped-SwiGLU experts in
    # MoE, YaRN (its attention factor in the op's cos / sin caches; the 700-token prompt past its
    # original context), alternating windows (tests/graph/test_gpt_oss.py builds the same graphs on the CPU)
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "swiglu_limit": 1.5,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150_000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 512,
            },
        },
    ),
}


def build(work: Path, name: str) -> tuple[Path, object, object]:
    """(HF folder, the HF model, its id tokenizer) of one of FAMILIES."""
    import torch
    import transformers

    config_class, model_class, overrides = FAMILIES[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**{**SHAPE, **overrides})).eval()
    with torch.no_grad():  # norms and biases away from their initial values, so a wrong convention shows
        for param_name, param in model.named_parameters():
            if "norm" in param_name or param_name.endswith(".bias"):
                param.normal_(0.5 if "norm" in param_name else 0.0, 0.2)
            elif param_name.endswith(".sinks"):  # gpt-oss's, near 0 at init
                param.normal_(0.0, 1.0)
    model.save_pretrained(work / f"{name}-hf")
    tokenizer = write_id_tokenizer(work / f"{name}-hf", SHAPE["vocab_size"])
    return work / f"{name}-hf", model, tokenizer


def tf32(x: Any) -> Any:
    """A float32 torch tensor rounded to TF32 (10 mantissa bits, to nearest even), as the tensor cores read it."""
    import torch

    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def tf32_emulation(work: Path, name: str, prompts: list[list[int]]) -> list[float]:
    """Max |logit| that TF32 alone moves HF float32's logits of each prompt, on the CPU: the model
    again with its weights and every linear layer's and expert block's inputs rounded to TF32."""
    import torch

    model: Any = build(work, name)[1]
    with torch.no_grad():
        refs = [model(torch.tensor([p])).logits[0] for p in prompts]
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(tf32(param))
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) or type(module).__name__.endswith("Experts"):
                module.register_forward_pre_hook(lambda _, args: tuple(tf32(a) if torch.is_tensor(a) else a for a in args))
        return [float((model(torch.tensor([p])).logits[0] - r).abs().max()) for p, r in zip(prompts, refs, strict=True)]
