"""wicore.devices.doctor on hand-built graphs: ONNX Runtime's placement on the CPU EP, and the published
lists' three answers (the CUDA EP's list as ORT's docs/OperatorKernels.md has it; an EP without one)."""

from __future__ import annotations

from onnx import TensorProto, helper

from wicore.devices.doctor import NOT_LISTED, UNLISTED, GraphReport, listed_placement, session_placement
from wicore.devices.graph_nodes import graph_nodes
from wicore.devices.op_tables import Support, op_table


def mixed_graph() -> object:
    """Add (float), Clip (int32) twice, Mod (int64), and one op of a domain no list covers."""
    f = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b", "total", "custom_out")]
    i32 = [helper.make_tensor_value_info(n, TensorProto.INT32, [4]) for n in ("c", "clipped", "clipped2")]
    i64 = [helper.make_tensor_value_info(n, TensorProto.INT64, [4]) for n in ("d", "e", "rest")]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["total"], name="add"),
        helper.make_node("Clip", ["c"], ["clipped"], name="clip"),
        helper.make_node("Clip", ["clipped"], ["clipped2"], name="clip2"),
        helper.make_node("Mod", ["d", "e"], ["rest"], name="mod"),
        helper.make_node("Frobnicate", ["total"], ["custom_out"], name="custom", domain="example.custom"),
    ]
    graph = helper.make_graph(nodes, "mixed", [f[0], f[1], i32[0], i64[0], i64[1]], [f[2], f[3], i32[2], i64[2]])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def standard_graph() -> object:
    """mixed_graph without its custom op: every node one the CPU EP runs."""
    model = mixed_graph()
    del model.graph.node[4]  # type: ignore[attr-defined]
    del model.graph.output[1]  # type: ignore[attr-defined]
    return model


def rows(groups) -> list[tuple[str, int, str]]:
    return [(g.label, len(g.names), g.reason) for g in groups]


def test_nodes_are_typed_by_the_input_that_picks_their_kernel():
    typed = [(n.name, n.domain, n.op_type, n.dtype) for n in graph_nodes(mixed_graph())]
    assert typed == [
        ("add", "ai.onnx", "Add", "float"),
        ("clip", "ai.onnx", "Clip", "int32"),
        ("clip2", "ai.onnx", "Clip", "int32"),
        ("mod", "ai.onnx", "Mod", "int64"),
        ("custom", "example.custom", "Frobnicate", "float"),
    ]


def test_the_cuda_list_answers_taken_not_taken_and_unknown():
    table = op_table("CUDAExecutionProvider")
    assert table is not None and "OperatorKernels.md" in table.source
    # docs/OperatorKernels.md: the CUDA EP's Clip 13+ takes double, float, float16, int64, int8, uint64, uint8
    assert table.support("ai.onnx", "Clip", "float") is Support.TAKEN
    assert table.support("ai.onnx", "Clip", "int32") is Support.NOT_TAKEN
    assert table.support("", "Where", "float16") is Support.TAKEN
    assert table.support("com.microsoft", "PagedAttention", "float") is Support.NOT_TAKEN  # bfloat16, float16 only
    assert table.support("com.microsoft", "PagedAttention", "float16") is Support.TAKEN
    assert table.support("example.custom", "Frobnicate", "float") is Support.UNKNOWN
    assert op_table("TensorrtExecutionProvider") is None  # no list kept: unknown, never guessed


def test_the_directml_list_has_no_int64_mod_and_no_gather_block_quantized():
    table = op_table("DmlExecutionProvider")
    assert table is not None
    # docs/OperatorKernels.md: DirectML's Mod 13+ takes float, float16, int16, int32, int8, uint16, uint32, uint8
    assert table.support("ai.onnx", "Mod", "int64") is Support.NOT_TAKEN
    assert table.support("ai.onnx", "Mod", "int32") is Support.TAKEN
    assert table.support("com.microsoft", "GatherBlockQuantized", "uint8") is Support.NOT_TAKEN  # absent from the list
    assert table.support("com.microsoft", "MatMulNBits", "float16") is Support.TAKEN


def test_a_published_list_names_what_the_ep_does_not_take_and_what_it_does_not_know():
    report = listed_placement("mixed.onnx", mixed_graph(), "CUDAExecutionProvider")
    assert report.num_nodes == 5
    assert rows(report.fallbacks) == [("Clip (int32)", 2, NOT_LISTED)]
    assert rows(report.unknown) == [("example.custom.Frobnicate (float)", 1, UNLISTED)]
    assert report.fallbacks[0].names == ("clip", "clip2")
    assert report.verdict() == (
        "2 of 5 nodes fall back to the CPU: Clip (int32) x2; 1 of 5 nodes unknown (not in its list): "
        "example.custom.Frobnicate (float) x1"
    )
    assert report.source.startswith("published list: https://github.com/microsoft/onnxruntime/blob/")


def test_an_ep_without_a_list_is_unknown_for_every_node():
    report = listed_placement("mixed.onnx", mixed_graph(), "TensorrtExecutionProvider")
    assert report == GraphReport("mixed.onnx", "TensorrtExecutionProvider", "published list: none", 5, (), has_list=False)
    assert (
        report.verdict() == "unknown for all 5 nodes: no published operator list of TensorrtExecutionProvider is kept in WiCore"
    )


def test_the_cann_graph_modes_list_names_ops_not_types_and_takes_no_contrib_op():
    report = listed_placement("quantized.onnx", quantized_graph(), "CANNExecutionProvider")
    # cann_graph.cc: MatMul, Shape and ReduceProd are in cann_supported_ops (any type); com.microsoft never
    assert report.verdict() == "1 of 4 nodes fall back to the CPU: com.microsoft.GatherBlockQuantized (uint8) x1"
    assert listed_placement("standard.onnx", standard_graph(), "CANNExecutionProvider").verdict() == (
        "all 4 nodes on CANNExecutionProvider, by its list"
    )


def test_onnx_runtime_places_every_node_on_the_cpu_ep():
    report = session_placement("standard.onnx", standard_graph(), None, "CPUExecutionProvider", None)
    assert report.source.startswith("ORT placement (onnxruntime ")
    assert report.verdict() == "all 4 nodes on CPUExecutionProvider"


def test_a_graph_onnx_runtime_cannot_load_is_reported_not_raised():
    report = session_placement("mixed.onnx", mixed_graph(), None, "CPUExecutionProvider", None)
    assert report.error is not None and "Frobnicate" in report.error
    assert report.verdict() == f"no placement: {report.error}"


def quantized_graph() -> object:
    """GatherBlockQuantized (com.microsoft, which ONNX's inference does not type) feeding standard ops."""
    inputs = [
        helper.make_tensor_value_info("data", TensorProto.UINT8, [16, 4]),
        helper.make_tensor_value_info("ids", TensorProto.INT64, [3]),
        helper.make_tensor_value_info("scales", TensorProto.FLOAT, [16, 1]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 2]),
    ]
    nodes = [
        helper.make_node("GatherBlockQuantized", ["data", "ids", "scales"], ["rows"], name="embed", domain="com.microsoft"),
        helper.make_node("MatMul", ["rows", "w"], ["y"], name="proj"),
        helper.make_node("Shape", ["y"], ["shape"], name="shape"),
        helper.make_node("ReduceProd", ["shape"], ["count"], name="count", keepdims=0),
    ]
    outputs = [helper.make_tensor_value_info("count", TensorProto.INT64, [])]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(helper.make_graph(nodes, "quantized", inputs, outputs), opset_imports=opsets, ir_version=9)


def test_types_carry_past_an_op_onnx_cannot_type():
    typed = [(n.op_type, n.dtype) for n in graph_nodes(quantized_graph())]
    # the dequantized rows are float (its scales' type), so is the MatMul; Shape's output is int64
    assert typed == [("GatherBlockQuantized", "uint8"), ("MatMul", "float"), ("Shape", "float"), ("ReduceProd", "int64")]
    report = listed_placement("quantized.onnx", quantized_graph(), "CUDAExecutionProvider")
    # docs/OperatorKernels.md: the CUDA EP's ReduceProd 18+ takes double, float, float16, int32
    assert report.verdict() == "1 of 4 nodes fall back to the CPU: ReduceProd (int64) x1"
