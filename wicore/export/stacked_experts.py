"""Checkpoints that stack their experts in one tensor a projection (gpt-oss), split into WiCore's
per-expert [out, in] matrices (wicore.model.weights.expected_shapes).

gpt-oss stores a layer's experts as transformers' GptOssExperts holds them, transposed (x @ W):

    mlp.experts.gate_up_proj       [E, H, 2W]  columns g0, u0, g1, u1, ... (gate and up interleaved)
    mlp.experts.gate_up_proj_bias  [E, 2W]     the same interleaving
    mlp.experts.down_proj          [E, W, H]
    mlp.experts.down_proj_bias     [E, H]

The released gpt-oss checkpoints quantize these to MXFP4 (`*_blocks` / `*_scales`), which WiCore
does not read: such a folder is refused naming that.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wicore.errors import ModelSourceError

PREFIX = "mlp.experts."


def unstack_experts(load: Callable[[str], np.ndarray], has: Callable[[str], bool], num_experts: int) -> dict[str, np.ndarray]:
    """A layer's experts under WiCore's names (`mlp.experts.{e}.gate_proj`, `.gate_proj.bias`, ...):
    `load(name)` reads the layer's checkpoint tensor `name`, `has(name)` says whether it is there."""
    if has(PREFIX + "gate_up_proj_blocks"):
        raise ModelSourceError(
            "the experts are MXFP4 (gate_up_proj_blocks / _scales), which WiCore does not read: "
            "dequantize the checkpoint to bf16 first (transformers: from_pretrained, then save_pretrained)"
        )
    gate_up, gate_up_bias = load(PREFIX + "gate_up_proj"), load(PREFIX + "gate_up_proj_bias")
    down, down_bias = load(PREFIX + "down_proj"), load(PREFIX + "down_proj_bias")
    if gate_up.shape[0] != num_experts or down.shape[0] != num_experts:
        raise ModelSourceError(f"stacked experts of shape {gate_up.shape} and {down.shape}: the config has {num_experts} experts")
    tensors: dict[str, np.ndarray] = {}
    for e in range(num_experts):
        p = f"{PREFIX}{e}."
        tensors[p + "gate_proj"] = np.ascontiguousarray(gate_up[e][:, 0::2].T)
        tensors[p + "up_proj"] = np.ascontiguousarray(gate_up[e][:, 1::2].T)
        tensors[p + "down_proj"] = np.ascontiguousarray(down[e].T)
        tensors[p + "gate_proj.bias"] = gate_up_bias[e][0::2].copy()
        tensors[p + "up_proj.bias"] = gate_up_bias[e][1::2].copy()
        tensors[p + "down_proj.bias"] = down_bias[e].copy()
    return tensors
