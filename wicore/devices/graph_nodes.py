"""The nodes of an ONNX graph with the element type each one computes in: what `wicore doctor`
matches against an EP's published operator list (op_tables) and labels ONNX Runtime's placement with.

ONNX's shape inference types the standard ops; it does not know ONNX Runtime's contrib ops
(com.microsoft) or WiCore's own, and stops typing past them. The gaps are filled here in one pass
(output_types): a contrib op's outputs as its first input (true of MatMulNBits, RotaryEmbedding,
FastGelu, PagedAttention, MultiHeadAttention) or the input that OUTPUT_OF_INPUT names, a standard
op's by its rule (Shape: int64, Less: bool, Cast: its `to`, ...). A node whose deciding input stays
untyped keeps dtype None: "any type" to the lists.
Weights are not read (external data stays on disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from wicore.devices.op_tables import TYPED_INPUT

DEFAULT_DOMAIN = "ai.onnx"
INT64_OUTPUTS = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})
BOOL_OUTPUTS = frozenset(
    {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf"}
)
# ops whose outputs take the type of an input other than the first: Where's values, the dequantized
# rows of GatherBlockQuantized (its scales' type)
OUTPUT_OF_INPUT = {("ai.onnx", "Where"): 1, ("com.microsoft", "GatherBlockQuantized"): 2}


@dataclass(frozen=True)
class GraphNode:
    name: str
    domain: str  # "ai.onnx" for ONNX's own ops
    op_type: str
    dtype: str | None  # element type of the input that picks its kernel ("float", "int64", ...)


def load_graph(path: Path | str) -> onnx.ModelProto:
    """The graph at `path` without its weights."""
    return onnx.load(str(path), load_external_data=False)


def graph_nodes(model: onnx.ModelProto) -> list[GraphNode]:
    """Every top-level node of `model`, in graph order, with the element type of its deciding input."""
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # a graph ONNX cannot type at all: the types below come from its declarations
        pass
    graph = model.graph
    types: dict[str, int] = {t.name: t.data_type for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    nodes = []
    for node in graph.node:
        domain = node.domain or DEFAULT_DOMAIN
        if node.op_type == "Constant":
            types.setdefault(node.output[0], _constant_type(node))
        for output, element in zip(node.output, output_types(node, [types.get(name) for name in node.input])):
            if output and output not in types and element:
                types[output] = element
        index = TYPED_INPUT.get((domain, node.op_type), 0)
        element = types.get(node.input[index]) if len(node.input) > index and node.input[index] else None
        nodes.append(GraphNode(node.name, domain, node.op_type, type_name(element) if element else None))
    return nodes


def output_types(node: onnx.NodeProto, inputs: list[int | None]) -> list[int | None]:
    """The element types of `node`'s outputs from its inputs': what the graph's own inference leaves
    out downstream of an op it does not know (graph order is topological, so one pass types all)."""
    first = inputs[0] if inputs else None
    key = (node.domain or DEFAULT_DOMAIN, node.op_type)
    if key in OUTPUT_OF_INPUT:
        index = OUTPUT_OF_INPUT[key]
        return [inputs[index] if len(inputs) > index else None] * len(node.output)
    if node.op_type in INT64_OUTPUTS:
        return [onnx.TensorProto.INT64] * len(node.output)
    if node.op_type in BOOL_OUTPUTS:
        return [onnx.TensorProto.BOOL] * len(node.output)
    if node.op_type == "Cast":
        return [next((a.i for a in node.attribute if a.name == "to"), None)]
    if node.op_type == "ConstantOfShape":
        return [next((a.t.data_type for a in node.attribute if a.name == "value"), onnx.TensorProto.FLOAT)]
    if node.op_type == "TopK":
        return [first, onnx.TensorProto.INT64]
    return [first] * len(node.output)


def type_name(element_type: int) -> str:
    """ONNX's element type as ONNX Runtime's operator list spells it: 1 -> "float", 10 -> "float16"."""
    return helper.tensor_dtype_to_string(element_type).removeprefix("TensorProto.").lower()


def _constant_type(node: onnx.NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            return attribute.t.data_type
    return onnx.TensorProto.FLOAT if any(a.name.startswith("value_float") for a in node.attribute) else onnx.TensorProto.INT64
