"""A small ONNX graph writer: named nodes, shared constants, weights streamed to external data.

Weights never accumulate in memory: `Graph.weight` appends the array's bytes to
an external data file at once and keeps only a TensorProto that points there
(offset, length). A 27B export therefore holds one layer at a time.

Node names are hierarchical (`/model/layers.3/attn/q_proj/MatMul`) and a node's
outputs are named after it (`.../MatMul/output_0`), as in onnxruntime-genai's
builder, so a profile or a Netron view reads like the model's module tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ALIGN = 4096  # external data offsets aligned to pages, so ONNX Runtime can mmap them


MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops (MatMulNBits, PagedAttention, RotaryEmbedding, ...)


class DataFile:
    """An external data file that weights are appended to, possibly shared by several graphs."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = self.path.open("wb")
        self._offset = 0
        self._written: dict[str, tuple[int, int, np.dtype, tuple[int, ...]]] = {}

    def store(self, name: str, array: np.ndarray | Callable[[], np.ndarray]) -> tuple[int, int, np.dtype, tuple[int, ...]]:
        """Write a named tensor once; later calls with the same name return where it is
        without evaluating `array` (a thunk lets a shared tensor skip being loaded again)."""
        if name not in self._written:
            value = array() if callable(array) else array
            offset, length = self.append(value)
            self._written[name] = (offset, length, value.dtype, tuple(value.shape))
        return self._written[name]

    def append(self, array: np.ndarray) -> tuple[int, int]:
        """Write the array's bytes; return (offset, length)."""
        pad = -self._offset % _ALIGN
        if pad:
            self._file.write(b"\0" * pad)
            self._offset += pad
        data = np.ascontiguousarray(array).tobytes()
        self._file.write(data)
        offset = self._offset
        self._offset += len(data)
        return offset, len(data)

    def close(self) -> None:
        self._file.close()


class Graph:
    """Nodes, inputs, outputs and initializers of one ONNX graph under construction."""

    def __init__(self, name: str, data: DataFile | None = None) -> None:
        """`data`: where `weight` writes; a graph of inline constants only (the runtime's
        micro-graphs, wicore.devices.micrographs) needs none."""
        self.name = name
        self.data = data
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[TensorProto] = []
        self._weights: set[str] = set()
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}

    # -- graph interface -------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def has_input(self, name: str) -> bool:
        return any(value.name == name for value in self.inputs)

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    # -- tensors ---------------------------------------------------------------------
    def weight(self, name: str, array: np.ndarray | Callable[[], np.ndarray], data: DataFile | None = None) -> str:
        """A large initializer stored as external data (written now, not kept in memory)."""
        if name in self._weights:
            return name
        target = data or self.data
        if target is None:
            raise ValueError(f"weight {name!r}: this graph has no external data file")
        offset, length, dtype, shape = target.store(name, array)
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(dtype)
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", target.path.name), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        self._weights.add(name)
        return name

    def const(self, value: Any, dtype: type | np.dtype = np.int64) -> str:
        """A small constant, stored inline once however often it is used."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        name = self._consts.get(key)
        if name is None:
            name = f"/const/{len(self._consts)}"
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return name

    # -- nodes -----------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], name: str, out: str | None = None, **attrs: Any) -> str:
        """Add a single-output node named `name`; return its output name.

        `out` names the output directly (a graph output): no Identity node, whose copy
        would defeat binding an in-place update to the input's buffer.
        """
        outputs = [out or f"{name}/output_0"]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0]

    def op_multi(
        self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int, outs: Sequence[str | None] = (), **attrs: Any
    ) -> list[str]:
        """A node with several outputs; `outs` names some of them directly (None: the default name)."""
        outputs = [(outs[i] if i < len(outs) else None) or f"{name}/output_{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs

    def live_nodes(self) -> list[onnx.NodeProto]:
        """The nodes a graph output depends on, in order. Builders share values that not every graph reads
        (the shared prologue's attention mask where the attention is a kernel of its own that masks by
        itself): ONNX Runtime runs a node whose outputs nobody reads, each a kernel launch a step."""
        needed = {o.name for o in self.outputs}
        live = []
        for node in reversed(self.nodes):
            if any(name in needed for name in node.output):
                live.append(node)
                needed.update(node.input)
        return live[::-1]

    def to_model(self, opset: int, doc: str = "") -> onnx.ModelProto:
        nodes = self.live_nodes()
        used = {name for node in nodes for name in node.input}
        initializers = [t for t in self.initializers if t.name in used]
        graph = helper.make_graph(nodes, self.name, self.inputs, self.outputs, initializer=initializers, doc_string=doc)
        domains = sorted({node.domain for node in nodes if node.domain})  # com.microsoft contrib ops: version 1
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)],
            producer_name="wicore",
        )
        model.ir_version = min(model.ir_version, 10)
        return model


def rms_norm_f32(g: Graph, x: str, scale: np.ndarray, eps: float, name: str) -> str:
    """x / sqrt(mean(x^2) + eps) * scale on float32 x, in the standard ops ORT fuses into one kernel."""
    w = g.const(scale.astype(np.float32), np.float32)
    sq = g.op("Pow", [x, g.const(2.0, np.float32)], f"{name}/Pow")
    mean = g.op("ReduceMean", [sq], f"{name}/ReduceMean", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [mean, g.const(eps, np.float32)], f"{name}/Add")], f"{name}/Sqrt")
    return g.op("Mul", [g.op("Div", [x, std], f"{name}/Div"), w], f"{name}/Mul")


def gelu_tanh(g: Graph, x: str, name: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the pattern ORT fuses into FastGelu."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    cube = g.op("Mul", [g.op("Mul", [x, x], f"{name}/x2"), x], f"{name}/x3")
    inner = g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715, np.float32)], f"{name}/c3")], f"{name}/inner")
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(c, np.float32)], f"{name}/scaled")], f"{name}/Tanh")
    half_x = g.op("Mul", [x, g.const(0.5, np.float32)], f"{name}/half_x")
    return g.op("Mul", [half_x, g.op("Add", [t, g.const(1.0, np.float32)], f"{name}/one_plus")], f"{name}/out")


def silu(g: Graph, x: str, name: str) -> str:
    """x * sigmoid(x), the Llama and Qwen MLPs' activation."""
    return g.op("Mul", [x, g.op("Sigmoid", [x], f"{name}/Sigmoid")], f"{name}/silu")


def place_images(g: Graph, x: str, hidden: int) -> str:
    """The image tokens' embeddings replace their token embeddings (after the sqrt(hidden) scale,
    which HF applies to token embeddings only):

        x [b, s, H] ──► rows [b * s, H] ──► ScatterND rows[image_token_indices] = image_embeds ──► [b, s, H]
    """
    from wicore.graph import io

    p = "/model/embed_images"
    embeds = g.input(io.IMAGE_EMBEDS, TensorProto.FLOAT, ["num_image_tokens", hidden])
    indices = g.input(io.IMAGE_TOKEN_INDICES, TensorProto.INT64, ["num_image_tokens"])
    rows = g.op("Reshape", [x, g.const([-1, hidden])], f"{p}/rows")
    index = g.op("Unsqueeze", [indices, g.const([-1])], f"{p}/index")
    rows = g.op("ScatterND", [rows, index, embeds], f"{p}/ScatterND")
    return g.op("Reshape", [rows, g.op("Shape", [x], f"{p}/shape")], f"{p}/tokens")


def block_mass(g: Graph, probs: str, block_shape: str, name: str) -> str:
    """Attention probability each block received, summed over heads and queries: [b, max_blocks]
    (`block_shape` reshapes [b, total] to [b, max_blocks, block_size])."""
    per_key = g.op("ReduceSum", [probs, g.const([1, 2])], f"{name}/keys", keepdims=0)  # [b, total]
    per_slot = g.op("Reshape", [per_key, block_shape], f"{name}/blocks")
    return g.op("ReduceSum", [per_slot, g.const([2])], f"{name}/ReduceSum", keepdims=0)


def rotary(
    g: Graph, x: str, cos: str, sin: str, token_index: str | None, heads: int, head_dim: int, contrib: bool, name: str
) -> str:
    """Rotate-half RoPE on [b, s, heads, head_dim]: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). `contrib`:
    one com.microsoft.RotaryEmbedding kernel (its 4-D layout is [b, heads, s, hd], so it gets
    [b, s, heads * hd] and the positions as `token_index`); else standard ops on cos / sin rows."""
    if contrib:
        if token_index is None:
            raise ValueError("the contrib RotaryEmbedding needs the token index (shared_values with contrib)")
        flat = g.op("Reshape", [x, g.const([0, 0, -1])], f"{name}/flat")
        y = g.op("RotaryEmbedding", [flat, token_index, cos, sin], f"{name}/RotaryEmbedding", domain=MS_DOMAIN, num_heads=heads)
        return g.op("Reshape", [y, g.const([0, 0, heads, head_dim])], f"{name}/heads")
    half = head_dim // 2
    x1, x2 = g.op_multi("Split", [x, g.const([half, half])], f"{name}/Split", 2, axis=-1)
    a = g.op("Sub", [g.op("Mul", [x1, cos], f"{name}/x1cos"), g.op("Mul", [x2, sin], f"{name}/x2sin")], f"{name}/out1")
    b = g.op("Add", [g.op("Mul", [x2, cos], f"{name}/x2cos"), g.op("Mul", [x1, sin], f"{name}/x1sin")], f"{name}/out2")
    return g.op("Concat", [a, b], f"{name}/Concat", axis=-1)
