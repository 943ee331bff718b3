"""wicore.graph.ops.Graph: what a built model keeps."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from wicore.graph.ops import Graph


def test_a_model_keeps_only_the_nodes_and_constants_its_outputs_need():
    """A shared value no graph output reads (the prologue's attention mask where the attention masks by
    itself) is dropped with the constants only it read; the order of what stays is the builder's."""
    g = Graph("t")
    g.input("x", TensorProto.FLOAT, [2])
    a = g.op("Add", ["x", g.const([1.0], np.float32)], "/a")
    dead = g.op("Mul", [a, g.const([3.0], np.float32)], "/dead")
    g.op("Neg", [dead], "/dead_too")
    g.op("Sub", [a, "x"], "/b", out="y")
    g.output("y", TensorProto.FLOAT, [2])
    graph = g.to_model(17).graph
    assert [n.name for n in graph.node] == ["/a", "/b"]
    assert [t.name for t in graph.initializer] == ["/const/0"]
    assert len(g.nodes) == 4  # the builder's own list is left as built
