"""The text-decoder configuration the graph builder needs, read from any source.

One frozen dataclass, `DecoderConfig` (historically `DecoderConfig`, still its name in most
modules), whatever the source: a GGUF header, a Hugging Face config.json (transformers 4.x
`rope_theta`/`rope_local_base_freq` style or 5.x `rope_parameters` style, text-only or the
multimodal wrapper), or a shape recipe for random weights. `family` names its row of
wicore.model.families (what differs between Gemma 3, Llama and Qwen).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wicore.errors import UnsupportedModelError
from wicore.model.families import Family, family, family_of_model_type

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer type: base theta and scaling factor, linear or (with
    `original_max_position_embeddings` set) Llama 3's frequency-dependent scaling, or (with
    `short_factor` set) Phi-3's LongRoPE: each channel pair's frequency divided by its short or
    long factor, cos and sin times `attention_factor`, or (with `beta_fast` set) YaRN (gpt-oss):
    the fast pairs kept, the slow ones divided by `factor`, a linear ramp between, cos and sin
    times `attention_factor`. As transformers chooses them, a run whose
    positions reach past `original_max_position_embeddings` uses the long factors for all its
    tokens, any other the short ones (WiCore: per row and step, graph/shared_values.py)."""

    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 scaling only
    high_freq_factor: float = 4.0  # llama3 scaling only
    original_max_position_embeddings: int = 0  # > 0: llama3 scaling, or LongRoPE's switch
    short_factor: tuple[float, ...] = ()  # LongRoPE only: one factor a channel pair
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # LongRoPE and YaRN: cos and sin times this
    beta_fast: float = 0.0  # > 0: YaRN, the ramp's ends in rotations over original_max_position_embeddings
    beta_slow: float = 0.0
    truncate: bool = True  # YaRN: the ramp's ends rounded to whole channel pairs

    @property
    def is_yarn(self) -> bool:
        return self.beta_fast > 0

    @property
    def is_longrope(self) -> bool:
        return bool(self.short_factor)

    def __post_init__(self) -> None:
        object.__setattr__(self, "short_factor", tuple(float(f) for f in self.short_factor))  # from JSON lists
        object.__setattr__(self, "long_factor", tuple(float(f) for f in self.long_factor))
        if self.is_longrope and (len(self.short_factor) != len(self.long_factor) or not self.original_max_position_embeddings):
            raise UnsupportedModelError(
                "longrope scaling needs short_factor and long_factor of one length and original_max_position_embeddings"
            )
        if self.theta <= 0 or self.factor <= 0:
            raise UnsupportedModelError(f"invalid rope parameters: theta={self.theta}, factor={self.factor}")
        if self.is_yarn and (self.beta_slow <= 0 or not self.original_max_position_embeddings):
            raise UnsupportedModelError("yarn rope scaling needs beta_slow > 0 and original_max_position_embeddings")
        if self.original_max_position_embeddings and not self.is_yarn and self.high_freq_factor <= self.low_freq_factor:
            raise UnsupportedModelError(
                f"llama3 rope scaling: high_freq_factor {self.high_freq_factor} <= low_freq_factor {self.low_freq_factor}"
            )

    def inv_freq(self, head_dim: int, long: bool = False) -> np.ndarray:
        """float32 [head_dim / 2]: the rotation speed of each pair of channels, as transformers computes it
        (LongRoPE: with the short factors, or the long ones with `long`)."""
        half = head_dim // 2
        if self.is_longrope:
            if len(self.short_factor) != half:
                raise UnsupportedModelError(f"longrope: {len(self.short_factor)} factors for head_dim {head_dim}")
            ext = np.asarray(self.long_factor if long else self.short_factor, np.float32)
            shape = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
            return (np.float32(1.0) / (ext * np.float32(self.theta) ** shape)).astype(np.float32)
        if self.is_yarn:
            return yarn_inv_freq(self, head_dim)
        inv_freq = 1.0 / (self.theta ** (np.arange(0, half, dtype=np.int64).astype(np.float32) * 2 / head_dim))
        if not self.original_max_position_embeddings:
            return (inv_freq / self.factor).astype(np.float32)
        # transformers' _compute_llama3_parameters: long wavelengths scaled, short kept, a blend between.
        old = self.original_max_position_embeddings
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    rope_global: RopeConfig = RopeConfig(1_000_000.0)
    rope_local: RopeConfig = RopeConfig(10_000.0)
    query_pre_attn_scalar: float = 256.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    final_logit_softcapping: float | None = None
    bos_token_id: int = 2
    eos_token_id: int = 1
    pad_token_id: int = 0
    eos_token_ids: tuple[int, ...] = ()  # every id that ends generation, when the source lists several
    family: str = "gemma3"  # its row of wicore.model.families
    tie_word_embeddings: bool = True  # the LM head is the embedding table (else the source's lm_head)
    # Every layer slides (Mistral, Phi-3): the engine pages them as full-attention layers (their KV
    # kept whole) whose mask also keeps the last `window_all_layers` positions only.
    window_all_layers: int | None = None
    attn_logit_softcapping: float | None = None  # Gemma 2: scores = cap * tanh(scores / cap)
    embedding_multiplier: float | None = None  # Granite: embeddings times this (else the family's sqrt(H) or 1)
    residual_multiplier: float = 1.0  # Granite: each block's output times this before the residual add
    logits_scaling: float = 1.0  # Granite: logits divided by this
    num_experts: int = 0  # mixture of experts (the family's router): experts per layer, 0 for a dense MLP
    num_experts_per_tok: int = 0  # the top k each token is routed to
    moe_intermediate_size: int = 0  # an expert's MLP width
    norm_topk_prob: bool = True  # the top k's probabilities renormalised to sum to 1
    shared_expert_intermediate_size: int = 0  # the shared expert's width (families with one: Qwen2-MoE)
    swiglu_alpha: float = 1.0  # clamped-SwiGLU experts (gpt-oss): gate * sigmoid(alpha * gate)
    swiglu_limit: float = 0.0  # ... gate clamped above, up on both sides, at this; > 0 exactly for those families

    def __post_init__(self) -> None:
        family(self.family)
        if len(self.layer_types) != self.num_layers:
            raise UnsupportedModelError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise UnsupportedModelError(f"unknown layer types {sorted(unknown)}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.family_row.is_moe != (self.num_experts > 0):
            raise UnsupportedModelError(f"the {self.family} family {'needs' if self.family_row.is_moe else 'has no'} experts")
        if self.family_row.shared_expert != (self.shared_expert_intermediate_size > 0):
            raise UnsupportedModelError(
                f"the {self.family} family {'needs' if self.family_row.shared_expert else 'has no'} a shared expert"
            )
        if self.family_row.clamped_swiglu != (self.swiglu_limit > 0):
            raise UnsupportedModelError(
                f"the {self.family} family {'needs' if self.family_row.clamped_swiglu else 'has no'} swiglu_limit"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise UnsupportedModelError(f"num_experts_per_tok {self.num_experts_per_tok} of {self.num_experts} experts")

    @property
    def family_row(self) -> Family:
        """What the family does differently (wicore.model.families)."""
        return family(self.family)

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def long_rope_switch(self) -> int:
        """LongRoPE: the sequence length past which its keys take the long factors
        (original_max_position_embeddings); 0 for any other rotary embedding."""
        ropes = [r for r in (self.rope_global, self.rope_local) if r.is_longrope]
        return min((r.original_max_position_embeddings for r in ropes), default=0)

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecoderConfig:
        """Inverse of `to_dict` (the manifest's `config`)."""
        d = dict(d)
        d["layer_types"] = tuple(d["layer_types"])
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["rope_global"] = RopeConfig(**d["rope_global"])
        d["rope_local"] = RopeConfig(**d["rope_local"])
        return cls(**d)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> DecoderConfig:
        """From a Hugging Face config.json of a supported family (wicore.model.families); for
        Gemma 3 Gemma3ForCausalLM or the text half of Gemma3ForConditionalGeneration."""
        if "text_config" in cfg:
            top = cfg
            cfg = dict(cfg["text_config"])
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                cfg.setdefault(key, top.get(key))
        row = family_of_model_type(cfg.get("model_type", ""))
        if row.name != "gemma3":
            from wicore.model.hf_families import decoder_config_from_hf

            return decoder_config_from_hf(cls, row, cfg)
        num_layers = cfg["num_hidden_layers"]
        layer_types = cfg.get("layer_types") or default_layer_types(
            num_layers, int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        )
        rope_global, rope_local = _hf_rope(cfg)
        eos = cfg.get("eos_token_id", 1)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=num_layers,
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim", 256),
            layer_types=tuple(layer_types),
            sliding_window=cfg.get("sliding_window", 4096),
            rope_global=rope_global,
            rope_local=rope_local,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 131072),
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            bos_token_id=first_id(cfg.get("bos_token_id"), 2),
            eos_token_id=first_id(eos, 1),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (),
            pad_token_id=first_id(cfg.get("pad_token_id"), 0),
        )


def default_layer_types(num_layers: int, pattern: int = 6) -> list[str]:
    """Gemma 3's interleaving: every `pattern`-th layer is global, the rest slide."""
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


def first_id(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else default
    return int(value)


def rope_from_params(params: dict[str, Any], theta: float, layer_type: str) -> RopeConfig:
    """One layer type's RoPE from its HF parameters (`theta` where they name none)."""
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", theta))
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(f"{layer_type} layers: partial rotary embeddings are not supported")
    if kind == "default":
        return RopeConfig(theta)
    if kind == "linear":
        if "factor" not in params:
            raise UnsupportedModelError(f"{layer_type} layers: linear rope scaling without a factor")
        return RopeConfig(theta, float(params["factor"]))
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if any(key not in params for key in keys):
            raise UnsupportedModelError(f"{layer_type} layers: llama3 rope scaling needs {', '.join(keys)}")
        return RopeConfig(
            theta,
            float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    if kind == "yarn":
        if params.get("original_max_position_embeddings") is None:
            raise UnsupportedModelError(f"{layer_type} layers: yarn rope scaling needs original_max_position_embeddings")
        original = int(params["original_max_position_embeddings"])
        factor = float(params.get("factor") or int(params["max_position_embeddings"]) / original)
        attention_factor = params.get("attention_factor")
        if attention_factor is None:  # transformers' get_mscale
            mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
            attention_factor = (
                yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                if mscale and mscale_all_dim
                else yarn_mscale(factor)
            )
        return RopeConfig(
            theta,
            factor,
            original_max_position_embeddings=original,
            attention_factor=float(attention_factor),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
        )
    if kind in ("longrope", "su"):
        keys = ("short_factor", "long_factor", "original_max_position_embeddings", "max_position_embeddings")
        if any(params.get(key) is None for key in keys):
            raise UnsupportedModelError(f"{layer_type} layers: longrope scaling needs {', '.join(keys)}")
        original = int(params["original_max_position_embeddings"])
        factor = float(params.get("factor") or int(params["max_position_embeddings"]) / original)
        attention_factor = params.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        return RopeConfig(
            theta,
            original_max_position_embeddings=original,
            short_factor=tuple(params["short_factor"]),
            long_factor=tuple(params["long_factor"]),
            attention_factor=float(attention_factor),
        )
    raise UnsupportedModelError(
        f"{layer_type} layers: rope scaling {kind!r} is not supported; WiCore implements 'default', 'linear' "
        "(the scaling Gemma 3 checkpoints use), 'llama3', 'longrope' and 'yarn'"
    )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """transformers' _compute_yarn_parameters: per channel pair, the unscaled frequency (fast pairs,
    many rotations over the original context) and the one divided by `factor` (slow pairs), blended
    by a linear ramp between the pairs that make beta_fast and beta_slow rotations; float32."""
    original = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)
    pos_freqs = np.float32(rope.theta) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim))
    inv_extra = np.float32(1.0) / pos_freqs
    inv_inter = np.float32(1.0) / (np.float32(rope.factor) * pos_freqs)
    return (inv_inter * (1 - extrapolation) + inv_extra * extrapolation).astype(np.float32)


def _hf_rope(cfg: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) RoPE, read as transformers reads a Gemma 3 config: 5.x's `rope_parameters`
    per layer type, 4.x's `rope_scaling` (global layers only; merged over the former where both are
    given), with `rope_theta` / `rope_local_base_freq` where a layer type names no theta."""
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict) or set(params) - {FULL, SLIDING}:
        raise UnsupportedModelError(f"rope_parameters {params!r}: Gemma 3 configs key them by layer type ({FULL!r}, {SLIDING!r})")
    full = {**(params.get(FULL) or {}), **(cfg.get("rope_scaling") or {})}
    return (
        rope_from_params(full, float(cfg.get("rope_theta", 1_000_000.0)), FULL),
        rope_from_params(params.get(SLIDING) or {}, float(cfg.get("rope_local_base_freq", 10_000.0)), SLIDING),
    )
