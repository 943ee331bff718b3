"""KV blocks in 8 bits (`--kv-cache-dtype int8`, the portable attention): a quarter of float32's
bytes, half of float16's, so a pool holds ~4x (2x) the tokens.

Each token's K (or V) of one head, head_dim values, is stored in groups of GROUP (32) values, as
llama.cpp's q8_0 blocks are: per group the values q divided by a power of two and rounded, and
after all of them one exponent e a group:

    x  ≈  q * 2**e        q in [-127, 127],  e = ceil(log2(max|x| / 127)) over the group

so a group's largest value lands in [64, 127] and each value is within half a step, 2**(e - 1):
under 0.8% of the group's largest value. A row is head_dim + head_dim / GROUP int8s (+3%). The
scales live in the block itself, next to the values they scale: a block moves between tiers
(device, host, NVMe) as the same bytes, with nothing beside it, and a token is quantized once,
when its K/V are written (later steps read the same int8s). A power of two needs no float bytes
in an int8 tensor: the exponent is a small integer.

ONNX Runtime's PagedAttention (the CUDA graphs) takes int8 caches only with per-tensor or
per-channel scales fixed at export, which need calibration data: not done (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from wicore.graph.ops import Graph

QMAX = 127.0
TINY = 1e-30  # a group of zeros gets e = -106: still an int8, and q = 0
GROUP = 32  # values a scale covers (fewer when head_dim is smaller)


def group_size(head_dim: int) -> int:
    if head_dim % min(GROUP, head_dim):
        raise ValueError(f"int8 KV needs head_dim a multiple of {GROUP} (or below it), got {head_dim}")
    return min(GROUP, head_dim)


def kv_row_width(head_dim: int, kv_dtype: str) -> int:
    """Elements of one token's K (or V) of one head in the pools of `kv_dtype`."""
    return head_dim + head_dim // group_size(head_dim) if kv_dtype == "int8" else head_dim


def quantize_kv(g: Graph, x: str, head_dim: int, name: str) -> str:
    """float32 x [..., head_dim] -> int8 [..., head_dim + groups]: q, then e (module docstring)."""

    def f32(value: float) -> str:
        return g.const(np.float32(value), np.float32)

    group = group_size(head_dim)
    groups = g.op("Reshape", [x, g.const([-1, group])], f"{name}/groups")
    peak = g.op("ReduceMax", [g.op("Abs", [groups], f"{name}/abs")], f"{name}/peak", axes=[-1], keepdims=1)
    ratio = g.op("Div", [g.op("Max", [peak, f32(TINY)], f"{name}/peak_or_tiny"), f32(QMAX)], f"{name}/ratio")
    log2 = g.op("Div", [g.op("Log", [ratio], f"{name}/ln"), f32(math.log(2.0))], f"{name}/log2")
    exponent = g.op("Ceil", [log2], f"{name}/exponent")  # [groups, 1]
    scaled = g.op("Div", [groups, g.op("Pow", [f32(2.0), exponent], f"{name}/scale")], f"{name}/scaled")
    q = g.op("Clip", [g.op("Round", [scaled], f"{name}/round"), f32(-QMAX), f32(QMAX)], f"{name}/clip")
    shape = g.op("Shape", [x], f"{name}/shape")
    lead = g.op("Slice", [shape, g.const([0]), g.const([-1])], f"{name}/lead")
    e_shape = g.op("Concat", [lead, g.const([head_dim // group])], f"{name}/e_shape", axis=0)
    rows = [g.op("Reshape", [q, shape], f"{name}/q_rows"), g.op("Reshape", [exponent, e_shape], f"{name}/e_rows")]
    return g.op("Cast", [g.op("Concat", rows, f"{name}/packed", axis=-1)], f"{name}/int8", to=TensorProto.INT8)


def dequantize_kv(g: Graph, x: str, head_dim: int, name: str) -> str:
    """int8 x [..., head_dim + groups] -> float32 [..., head_dim]: q * 2**e."""
    group = group_size(head_dim)
    values = g.op("Cast", [x], f"{name}/float", to=TensorProto.FLOAT)
    q, exponent = g.op_multi("Split", [values, g.const([head_dim, head_dim // group])], f"{name}/split", 2, axis=-1)
    scales = g.op(
        "Pow",
        [g.const(np.float32(2.0), np.float32), g.op("Reshape", [exponent, g.const([-1, 1])], f"{name}/e")],
        f"{name}/scales",
    )
    groups = g.op("Mul", [g.op("Reshape", [q, g.const([-1, group])], f"{name}/q_groups"), scales], f"{name}/groups")
    return g.op("Reshape", [groups, g.op("Shape", [q], f"{name}/shape")], f"{name}/dequantized")
