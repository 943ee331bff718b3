"""What a model source hands the graph builder: a config and weights, layer by layer.

Every source normalises to one convention, Hugging Face's: linear weights are
[out_features, in_features] float32; RMSNorm weights are the `w` of
`x * (norm_offset + w)`, the family's RMSNorm (wicore.model.families: Gemma's `1 + w`, which
GGUF stores summed and its reader splits once here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from wicore.errors import UnsupportedModelError
from wicore.model.config import DecoderConfig
from wicore.model.families import ALL_HEADS, PER_HEAD
from wicore.model.vision import VisionWeights


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer: `tensors[name]` for every name of `expected_shapes`."""

    index: int
    tensors: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]


class WeightSource(Protocol):
    """A model source. Weights come one layer at a time so a 27B export never holds it all."""

    config: DecoderConfig

    def describe(self) -> dict[str, Any]:
        """JSON-able description of where the weights came from (for the manifest)."""

    def embedding(self) -> np.ndarray:
        """Token embedding [vocab_size, hidden_size], also the tied LM head."""

    def final_norm(self) -> np.ndarray:
        """Final RMSNorm weight [hidden_size] (HF convention)."""

    def lm_head(self) -> np.ndarray | None:
        """The untied LM head [vocab_size, hidden_size]; None where the embedding is the head."""

    def layer(self, index: int) -> LayerWeights:
        """The weights of decoder layer `index`."""

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        """Write tokenizer files into out_dir; return the manifest's tokenizer record, or None."""

    def vision(self) -> VisionWeights | None:
        """The vision tower and projector of a multimodal model; None for a text-only one."""

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """The vocabulary ids of those of `tokens` the model's vocabulary has (special tokens by name)."""


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every per-layer tensor, by Hugging Face's (Gemma 3's) short names: the family's
    norms, q/k norms, biases (`*.bias`) and attention sinks where it has them (wicore.model.families);
    a mixture of experts has `mlp.router` [experts, hidden] and `mlp.experts.{e}.gate_proj` / `up_proj` /
    `down_proj` (with `moe_bias`, each with its `.bias`)."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    row = cfg.family_row
    shapes: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
    }
    if row.qkv_bias:
        shapes.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    if row.o_bias:
        shapes["self_attn.o_proj.bias"] = (h,)
    if row.attention_sinks:
        shapes["self_attn.sinks"] = (cfg.num_heads,)
    if row.qk_norm == PER_HEAD:
        shapes.update({"self_attn.q_norm": (cfg.head_dim,), "self_attn.k_norm": (cfg.head_dim,)})
    elif row.qk_norm == ALL_HEADS:
        shapes.update({"self_attn.q_norm": (q,), "self_attn.k_norm": (kv,)})
    if row.is_moe:
        shapes["mlp.router"] = (cfg.num_experts, h)
        for e in range(cfg.num_experts):
            shapes.update(mlp_shapes(f"mlp.experts.{e}.", h, cfg.moe_intermediate_size))
        if row.moe_bias:
            shapes["mlp.router.bias"] = (cfg.num_experts,)
            for e in range(cfg.num_experts):
                shapes.update(
                    {f"mlp.experts.{e}.{n}.bias": (w[0],) for n, w in mlp_shapes("", h, cfg.moe_intermediate_size).items()}
                )
        if row.shared_expert:
            shapes.update(mlp_shapes("mlp.shared_expert.", h, cfg.shared_expert_intermediate_size))
            shapes["mlp.shared_expert_gate"] = (1, h)
    else:
        shapes.update(mlp_shapes("mlp.", h, cfg.intermediate_size))
    shapes.update({name: (h,) for name in row.layer_norm_names()})
    return shapes


def mlp_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}gate_proj": (inter, hidden), f"{prefix}up_proj": (inter, hidden), f"{prefix}down_proj": (hidden, inter)}


def check_layer(cfg: DecoderConfig, layer: LayerWeights) -> None:
    """Raise UnsupportedModelError unless `layer` has every tensor at the config's shape."""
    for name, shape in expected_shapes(cfg).items():
        tensor = layer.tensors.get(name)
        if tensor is None:
            raise UnsupportedModelError(f"layer {layer.index}: tensor {name} is missing")
        if tuple(tensor.shape) != shape:
            raise UnsupportedModelError(
                f"layer {layer.index}: {name} has shape {tuple(tensor.shape)}, the config implies {shape}"
            )
