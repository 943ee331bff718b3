"""DecoderConfig from the config.json of every family but Gemma 3 (whose reader is in config.py).

Read as transformers reads them: RoPE from 5.x's flat `rope_parameters` or 4.x's `rope_theta` +
`rope_scaling`, with one RoPE for all layers; the layer types from `layer_types`, else Qwen2's
`use_sliding_window` / `max_window_layers`, else every layer full; where such a config names a
`sliding_window` (Mistral, Mixtral, Phi-3) transformers masks every layer with it, which the
config keeps as `window_all_layers`.
Where families name one number differently (an expert count, the attention scale) the keys are
read in turn; which mechanism a family has is its row (wicore.model.families).
"""

from __future__ import annotations

from typing import Any

from wicore.errors import UnsupportedModelError
from wicore.model.config import FULL, SLIDING, DecoderConfig, first_id, rope_from_params
from wicore.model.families import Family

# config.json activation name -> the family table's
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def decoder_config_from_hf(cls: type[DecoderConfig], row: Family, cfg: dict[str, Any]) -> DecoderConfig:
    model_type = cfg.get("model_type")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or row.activation
    if cfg.get("mlp_bias") or _ACTIVATIONS.get(act) != row.activation:
        raise UnsupportedModelError(f"{model_type}: only bias-free {row.activation}-gated MLPs are supported (got {act})")
    if bool(cfg.get("attention_bias", row.qkv_bias)) != row.qkv_bias:
        raise UnsupportedModelError(
            f"{model_type}: attention_bias={cfg.get('attention_bias')} is not supported for the {row.name} family"
        )
    num_layers = int(cfg["num_hidden_layers"])
    params = cfg.get("rope_parameters") or {}
    params = {**params, **(cfg.get("rope_scaling") or {})}
    if "partial_rotary_factor" in cfg:
        params.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    if cfg.get("original_max_position_embeddings") is not None:  # Phi-3 keeps it at the top level
        params.setdefault("original_max_position_embeddings", cfg["original_max_position_embeddings"])
    params.setdefault("max_position_embeddings", cfg.get("max_position_embeddings"))
    rope = rope_from_params(params, float(cfg.get("rope_theta", 10_000.0)), FULL)
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    eos = cfg.get("eos_token_id", 2)
    return cls(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        layer_types=layer_types(cfg, num_layers),
        sliding_window=int(cfg.get("sliding_window") or 4096),
        rope_global=rope,
        rope_local=rope,
        query_pre_attn_scalar=attention_scalar(cfg, head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        window_all_layers=window_all_layers(cfg),
        bos_token_id=first_id(cfg.get("bos_token_id"), 1),
        eos_token_id=first_id(eos, 2),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (),
        pad_token_id=first_id(cfg.get("pad_token_id"), first_id(eos, 2)),
        family=row.name,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        embedding_multiplier=cfg.get("embedding_multiplier"),
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
        logits_scaling=float(cfg.get("logits_scaling", 1.0)),
        **experts(row, cfg, num_layers),
    )


def layer_types(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    if cfg.get("layer_types") is not None:
        return tuple(cfg["layer_types"])
    if "use_sliding_window" in cfg:  # Qwen2 / Qwen3: the layers from max_window_layers on slide
        if not cfg["use_sliding_window"]:
            return (FULL,) * num_layers
        first = int(cfg.get("max_window_layers", num_layers))
        return tuple(SLIDING if i >= first else FULL for i in range(num_layers))
    return (FULL,) * num_layers  # a window on every layer: DecoderConfig.window_all_layers


def window_all_layers(cfg: dict[str, Any]) -> int | None:
    """The window of a config that slides every layer (no layer_types, no use_sliding_window)."""
    if cfg.get("layer_types") is not None or "use_sliding_window" in cfg or not cfg.get("sliding_window"):
        return None
    return int(cfg["sliding_window"])


def attention_scalar(cfg: dict[str, Any], head_dim: int) -> float:
    """DecoderConfig.query_pre_attn_scalar: scores are scaled by its -1/2 power (Granite names the
    scale itself, `attention_multiplier`; Gemma 2 the scalar; the rest use head_dim)."""
    if cfg.get("attention_multiplier") is not None:
        return float(cfg["attention_multiplier"]) ** -2
    return float(cfg.get("query_pre_attn_scalar") or head_dim)


def experts(row: Family, cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a row with a router (Qwen3-MoE's, Mixtral's, Qwen2-MoE's, gpt-oss's keys;
    gpt-oss's expert width is its intermediate_size, and it renormalises the top k with no key)."""
    if not row.is_moe:
        return {}
    model_type = cfg.get("model_type")
    if int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers"):
        raise UnsupportedModelError(f"{model_type}: dense layers among the expert layers (mlp_only_layers) are not supported")
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    if bool(shared) != row.shared_expert:
        raise UnsupportedModelError(f"{model_type}: shared_expert_intermediate_size={shared} for the {row.name} family")
    swiglu = {"swiglu_alpha": float(cfg.get("swiglu_alpha", 1.702)), "swiglu_limit": float(cfg.get("swiglu_limit", 7.0))}
    return {
        **(swiglu if row.clamped_swiglu else {}),
        "shared_expert_intermediate_size": shared,
        "num_experts": int(cfg.get("num_experts") or cfg["num_local_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", True)),  # Mixtral renormalises and has no key
    }
