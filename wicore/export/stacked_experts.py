"""Checkpoints that stack their experts in one tensor a projection (gpt-oss), split into WiCore's
per-expert [out, in] matrices (wicore.model.weights.expected_shapes).

gpt-oss stores a layer's experts as transformers' GptOssExperts holds them, transposed (x @ W):

    mlp.experts.gate_up_proj       [E, H, 2W]  columns g0, u0, g1, u1, ... (gate and up interleaved)
    mlp.experts.gate_up_proj_bias  [E, 2W]     the same interleaving
    mlp.experts.down_proj          [E, W, H]
    mlp.experts.down_proj_bias     [E, H]

The released gpt-oss checkpoints store the two matrices in MXFP4, as [out, in] blocks of 32:

    mlp.experts.gate_up_proj_blocks  [E, 2W, H / 32, 16]  uint8: two E2M1 codes a byte, the low nibble first
    mlp.experts.gate_up_proj_scales  [E, 2W, H / 32]      uint8: E8M0, the block's power of two + 127
    (down_proj_blocks / _scales the same over [E, H, W])

dequantized here exactly (every value is a float32; transformers' `convert_moe_packed_tensors`
computes the same) into the layout above.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wicore.errors import ModelSourceError

PREFIX = "mlp.experts."
# E2M1 code -> value (the sign is the code's top bit)
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 [..., G, 16] codes and [..., G] exponents (module doc) -> [..., G * 32] float32, exactly."""
    codes = blocks.astype(np.uint8)
    values = np.stack((FP4_VALUES[codes & 0x0F], FP4_VALUES[codes >> 4]), axis=-1).reshape(*codes.shape[:-1], 32)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*codes.shape[:-2], -1)


def _stacked(load: Callable[[str], np.ndarray], has: Callable[[str], bool], name: str) -> np.ndarray:
    """The stacked matrix `name` in GptOssExperts' layout, from its MXFP4 blocks where it has them."""
    if not has(PREFIX + name + "_blocks"):
        return load(PREFIX + name)
    rows = dequantize_mxfp4(load(PREFIX + name + "_blocks"), load(PREFIX + name + "_scales"))  # [E, out, in]
    return np.ascontiguousarray(rows.transpose(0, 2, 1))


def unstack_experts(load: Callable[[str], np.ndarray], has: Callable[[str], bool], num_experts: int) -> dict[str, np.ndarray]:
    """A layer's experts under WiCore's names (`mlp.experts.{e}.gate_proj`, `.gate_proj.bias`, ...):
    `load(name)` reads the layer's checkpoint tensor `name`, `has(name)` says whether it is there."""
    gate_up, gate_up_bias = _stacked(load, has, "gate_up_proj"), load(PREFIX + "gate_up_proj_bias")
    down, down_bias = _stacked(load, has, "down_proj"), load(PREFIX + "down_proj_bias")
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
