"""DecoderConfig from the config.json of a Llama or Qwen family model (Gemma 3's is in config.py).

Read as transformers reads them: RoPE from 5.x's flat `rope_parameters` or 4.x's `rope_theta` +
`rope_scaling`; every layer full attention unless `layer_types` / `use_sliding_window` say
otherwise (Qwen2 and Qwen3), with one RoPE for all layers.
"""

from __future__ import annotations

from typing import Any

from wicore.errors import UnsupportedModelError
from wicore.model.config import FULL, SLIDING, DecoderConfig, first_id, rope_from_params
from wicore.model.families import Family


def decoder_config_from_hf(cls: type[DecoderConfig], row: Family, cfg: dict[str, Any]) -> DecoderConfig:
    model_type = cfg.get("model_type")
    if cfg.get("mlp_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"{model_type}: only bias-free SiLU-gated MLPs are supported")
    if bool(cfg.get("attention_bias", row.qkv_bias)) != row.qkv_bias:
        raise UnsupportedModelError(
            f"{model_type}: attention_bias={cfg.get('attention_bias')} is not supported for the {row.name} family"
        )
    num_layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        if cfg.get("use_sliding_window"):
            first_full = int(cfg.get("max_window_layers", num_layers))
            layer_types = [SLIDING if i >= first_full else FULL for i in range(num_layers)]
        elif model_type == "mistral" and cfg.get("sliding_window"):
            raise UnsupportedModelError("mistral with a sliding window is not supported; set sliding_window to null")
        else:
            layer_types = [FULL] * num_layers
    params = cfg.get("rope_parameters") or {}
    params = {**params, **(cfg.get("rope_scaling") or {})}
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
        layer_types=tuple(layer_types),
        sliding_window=int(cfg.get("sliding_window") or 4096),
        rope_global=rope,
        rope_local=rope,
        query_pre_attn_scalar=float(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        bos_token_id=first_id(cfg.get("bos_token_id"), 1),
        eos_token_id=first_id(eos, 2),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (),
        pad_token_id=first_id(cfg.get("pad_token_id"), first_id(eos, 2)),
        family=row.name,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
