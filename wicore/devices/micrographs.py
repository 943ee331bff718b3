"""The tiny ONNX graphs the runtime runs beside the model's: they move KV blocks and allocate
tensors on a device, where NumPy cannot reach. Each takes a device's buffers as inputs and is run
with its outputs bound at the buffers' own addresses, so nothing is copied whole.

    zeros   shape [rank] -> ConstantOfShape -> zeros [*shape]        a tensor in the session's arena
    gather  frames [n], pool_j [N, *block] -> Gather(axis 0) -> Unsqueeze(1) -> Concat(1)
                                               -> blocks [n, P, *block]   (j = 2 * layer + k|v)
    put     blocks [n, P, *block] -> Gather(j, axis 1) -> pool_j_out [n, *block]   (bound at frames)
    take    frames [n], k, v [N, *block] -> Gather(axis 0) -> k_out, v_out [n, *block]
    copy    k, v [n, *block] -> Identity -> k_out, v_out        (a copy between bound addresses)
    handoff x [*shape] -> Identity -> x_out     (bound on two devices: ONNX Runtime copies card to card)

Built with the exporter's graph writer (wicore.graph.ops), at the opset and IR version the
model's graphs use.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from wicore.graph.ops import Graph

OPSET = 17
FRAMES = "frames"
BLOCKS = "blocks"


def pool_name(j: int) -> str:
    """Pool j of a device's pools: layer j // 2, key (even) or value (odd)."""
    return f"{'key' if j % 2 == 0 else 'value'}_cache.{j // 2}"


def zeros_graph(dtype: np.dtype, rank: int) -> onnx.ModelProto:
    """shape [rank] int64 -> zeros [*shape] of `dtype`."""
    g = Graph("wicore_zeros")
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    shape = g.input("shape", TensorProto.INT64, [rank])
    g.op("ConstantOfShape", [shape], "/zeros", out="zeros", value=helper.make_tensor("value", elem, [1], [0]))
    g.output("zeros", elem, [f"d{i}" for i in range(rank)])
    return g.to_model(OPSET)


def gather_graph(num_pools: int, elem: int, block_shape: tuple[int, ...]) -> onnx.ModelProto:
    """frames [n] -> blocks [n, num_pools, *block_shape]: the frames' blocks of every pool."""
    g = Graph("wicore_pager_gather")
    frames = g.input(FRAMES, TensorProto.INT64, ["n"])
    axis = g.const([1])
    parts = []
    for j in range(num_pools):
        prefix = f"/pager/{pool_name(j)}"
        pool = g.input(pool_name(j), elem, ["num_blocks", *block_shape])
        gathered = g.op("Gather", [pool, frames], f"{prefix}/Gather", axis=0)
        parts.append(g.op("Unsqueeze", [gathered, axis], f"{prefix}/Unsqueeze"))
    g.op("Concat", parts, "/pager/Concat", out=BLOCKS, axis=1)
    g.output(BLOCKS, elem, ["n", num_pools, *block_shape])
    return g.to_model(OPSET)


def put_graph(num_pools: int, elem: int, block_shape: tuple[int, ...]) -> onnx.ModelProto:
    """blocks [n, num_pools, *block_shape] -> `{pool_j}_out` = blocks[:, j], each bound by the caller
    at n consecutive frames of pool j."""
    g = Graph("wicore_pager_put")
    blocks = g.input(BLOCKS, elem, ["n", num_pools, *block_shape])
    for j in range(num_pools):
        out = f"{pool_name(j)}_out"
        g.op("Gather", [blocks, g.const(j)], f"/pager/{pool_name(j)}/Gather", out=out, axis=1)
        g.output(out, elem, ["n", *block_shape])
    return g.to_model(OPSET)


def take_graph(elem: int, block_shape: tuple[int, ...]) -> onnx.ModelProto:
    """k_out, v_out = Gather(k, frames), Gather(v, frames): the caller binds the outputs at n consecutive
    frames of other buffers (an offloaded step's stage: wicore.kv.offload)."""
    g = Graph("wicore_take")
    frames = g.input(FRAMES, TensorProto.INT64, ["n"])
    for kv in "kv":
        g.input(kv, elem, ["num_blocks", *block_shape])
        g.op("Gather", [kv, frames], f"/take/{kv}", out=f"{kv}_out", axis=0)
        g.output(f"{kv}_out", elem, ["n", *block_shape])
    return g.to_model(OPSET)


def copy_graph(elem: int, block_shape: tuple[int, ...]) -> onnx.ModelProto:
    """k_out, v_out = k, v: bound at two buffers' addresses, a copy of consecutive blocks."""
    g = Graph("wicore_block_copy")
    for kv in "kv":
        g.input(kv, elem, ["n", *block_shape])
        g.op("Identity", [kv], f"/copy/{kv}", out=f"{kv}_out")
        g.output(f"{kv}_out", elem, ["n", *block_shape])
    return g.to_model(OPSET)


def handoff_graph(elem: int, shape: tuple[int | str, ...]) -> onnx.ModelProto:
    """x_out = x: run on the session's device with `x` bound on another, ONNX Runtime copies it device
    to device into the buffer bound as `x_out` (a partition's hidden states, wicore.executor.cuda_graphs)."""
    g = Graph("wicore_handoff")
    x = g.input("x", elem, list(shape))
    g.op("Identity", [x], "/handoff/Identity", out="x_out")
    g.output("x_out", elem, list(shape))
    return g.to_model(OPSET)
