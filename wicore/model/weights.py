"""What a model source hands the graph builder: a config and weights, layer by layer.

Every source normalises to one convention, Hugging Face's: linear weights are
[out_features, in_features] float32; RMSNorm weights are the `w` of
`x * (1 + w)` (GGUF stores `1 + w`; its reader subtracts the 1 once here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from wicore.errors import UnsupportedModelError
from wicore.model.config import Gemma3Config
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

    config: Gemma3Config

    def describe(self) -> dict[str, Any]:
        """JSON-able description of where the weights came from (for the manifest)."""

    def embedding(self) -> np.ndarray:
        """Token embedding [vocab_size, hidden_size], also the tied LM head."""

    def final_norm(self) -> np.ndarray:
        """Final RMSNorm weight [hidden_size] (HF convention)."""

    def layer(self, index: int) -> LayerWeights:
        """The weights of decoder layer `index`."""

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        """Write tokenizer files into out_dir; return the manifest's tokenizer record, or None."""

    def vision(self) -> VisionWeights | None:
        """The vision tower and projector of a multimodal model; None for a text-only one."""

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """The vocabulary ids of those of `tokens` the model's vocabulary has (special tokens by name)."""


def expected_shapes(cfg: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Shape of every per-layer tensor, by Hugging Face's short names (used to check a source before building)."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "self_attn.q_norm": (cfg.head_dim,),
        "self_attn.k_norm": (cfg.head_dim,),
        "mlp.gate_proj": (cfg.intermediate_size, h),
        "mlp.up_proj": (cfg.intermediate_size, h),
        "mlp.down_proj": (h, cfg.intermediate_size),
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
        "pre_feedforward_layernorm": (h,),
        "post_feedforward_layernorm": (h,),
    }


def check_layer(cfg: Gemma3Config, layer: LayerWeights) -> None:
    """Raise UnsupportedModelError unless `layer` has every tensor at the config's shape."""
    for name, shape in expected_shapes(cfg).items():
        tensor = layer.tensors.get(name)
        if tensor is None:
            raise UnsupportedModelError(f"layer {layer.index}: tensor {name} is missing")
        if tuple(tensor.shape) != shape:
            raise UnsupportedModelError(
                f"layer {layer.index}: {name} has shape {tuple(tensor.shape)}, the config implies {shape}"
            )
