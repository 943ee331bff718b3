"""tools/op_profile.py on made-up profiles (which events count, which clock), and tools/profile_ops.py
on the tiny random Gemma 3 in two partitions on the CPU EP: every node of both optimized graphs once
a graph run, no copy. The WebGPU side is tests/portability/test_webgpu_ops.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from op_profile import OpTable, format_table, op_table
from prefix_cuts import dominator_cuts, sub_model

REPO = Path(__file__).resolve().parent.parent


def run_event(ts: int, dur: int) -> dict:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "args": {}}


def node_event(name: str, op: str, ts: int, dur: int, shapes: list | None = None) -> dict:
    args = {"op_name": op, "input_type_shape": shapes or [{"float": [1, 64]}]}
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": args}


def webgpu_event(name: str, ts: int, dur: int, shapes: str) -> dict:
    return {"cat": "Api", "name": name, "ts": ts, "dur": dur, "args": {"shapes": shapes, "cache_key": name[-3:]}}


# A prefill run (not timed), then two timed runs: each a MatMul and a copy of an int32 [2, 3] table.
HOST_EVENTS = [
    run_event(0, 100),
    node_event("a", "MatMul", 10, 50),
    run_event(200, 40),
    node_event("a", "MatMul", 205, 20),
    node_event("Memcpy", "MemcpyFromHost", 230, 4, [{"int32": [2, 3]}]),
    run_event(300, 60),
    node_event("a", "MatMul", 305, 30),
    node_event("Memcpy", "MemcpyFromHost", 340, 6, [{"int32": [2, 3]}]),
]


def test_the_host_table_reads_the_timed_runs_node_events_and_their_copies():
    table = op_table([HOST_EVENTS], num_runs=2)
    assert (table.source, table.run_us, table.kernel_us) == ("host", 50.0, 30.0)
    assert table.by_op() == [("MatMul", 1, 1.0, 25.0), ("MemcpyFromHost", 1, 1.0, 5.0)]
    assert (table.copy_calls["MemcpyFromHost"], table.copy_bytes["MemcpyFromHost"], table.copy_us["MemcpyFromHost"]) == (1, 24, 5)
    assert table.copy_shapes == {"Memcpy": [{"int32": [2, 3]}]}
    assert table.copy_calls["MemcpyToHost"] == 0


def test_webgpu_gpu_events_are_the_tail_that_repeats_once_a_run():
    """The WebGPU EP's events count from its first GPU timestamp, not the host's clock: the prefill's
    dispatches (other shapes) come first, then the two timed runs' identical ones."""
    gpu = [
        webgpu_event("a&MatMul&MatMulNBits", 0, 100, "s0"),
        webgpu_event("b&Add&Add", 100, 7, "s0"),
        webgpu_event("a&MatMul&MatMulNBits", 150, 10, "s1"),
        webgpu_event("b&Add&Add", 160, 2, "s1"),
        webgpu_event("a&MatMul&MatMulNBits", 170, 14, "s1"),
        webgpu_event("b&Add&Add", 184, 4, "s1"),
    ]
    table = op_table([HOST_EVENTS + gpu], num_runs=2)
    assert table.source == "gpu"
    assert dict(table.us_by_node) == {("a", "MatMul (MatMulNBits)"): 12.0, ("b", "Add"): 3.0}
    assert dict(table.calls_by_node) == {("a", "MatMul (MatMulNBits)"): 1.0, ("b", "Add"): 1.0}
    assert table.copy_bytes["MemcpyFromHost"] == 24  # copies still from the node events
    with pytest.raises(ValueError, match="do not repeat"):
        op_table([HOST_EVENTS + gpu[:-1]], num_runs=2)


def test_cupti_kernel_events_count_inside_the_timed_runs():
    kernels = [
        {"cat": "Kernel", "name": "gemv", "ts": ts, "dur": dur, "args": {"op_name": "MatMul", "parent_name": "a"}}
        for ts, dur in ((20, 90), (210, 8), (310, 12))
    ]
    table = op_table([HOST_EVENTS + kernels], num_runs=2)
    assert table.source == "gpu" and dict(table.us_by_node) == {("a", "MatMul"): 10.0}


def test_two_sessions_add_their_runs_and_keep_their_nodes_apart():
    table = op_table([HOST_EVENTS, HOST_EVENTS], num_runs=2)
    assert table.run_us == 100.0 and len(table.us_by_node) == 4
    assert table.by_op() == [("MatMul", 2, 2.0, 50.0), ("MemcpyFromHost", 2, 2.0, 10.0)]
    text = format_table("t", table, top=1)
    assert "| **all kernels** | 4 | 4 | 60.0 | 60.0% |" in text
    assert "| (run, outside kernels) | | | 40.0 | 40.0% |" in text
    assert "| part-00:a | MatMul | 25.0 | 25.0% |" in text and "part-01:a" not in text  # top 1
    assert "MemcpyFromHost 2 a run, 48 bytes, 10.0 µs" in text


def test_too_few_runs_is_an_error():
    with pytest.raises(ValueError, match="3 runs, fewer than the 4"):
        op_table([HOST_EVENTS], num_runs=4)
    assert OpTable("host", 1).by_op() == []


def optimized_nodes(folder: Path) -> Counter:
    """(partition, node name, op type) of the CPU EP's optimized graphs, with the engine's session options."""
    import onnx

    from wicore.devices.providers import onnxruntime, parse_device, session_options
    from wicore.graph.manifest import Manifest

    device = parse_device("cpu")
    nodes: Counter = Counter()
    for i, part in enumerate(Manifest.read(folder).partitions):
        options = session_options(2, devices=[device])
        options.optimized_model_filepath = str(folder.parent / f"optimized-{i}.onnx")
        onnxruntime().InferenceSession(str(folder / part.file), sess_options=options, providers=device.providers())
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
        nodes.update((f"part-{i:02d}:{n.name}", n.op_type) for n in graph.node)
    return nodes


@pytest.mark.slow  # the tiny export in two partitions, and a subprocess of 3 steps at 2 batch sizes: ~15 s
def test_the_cpu_table_holds_every_node_of_both_partitions_once_a_run(tiny_export, tmp_path):
    folder, _ = tiny_export(partitions=2)
    record_path = tmp_path / "ops.json"
    command = [sys.executable, str(REPO / "tools" / "profile_ops.py"), "--model-dir", str(folder), "--batch", "1,2"]
    command += ["--context", "12", "--steps", "3", "--top", "4", "--json", str(record_path)]
    result = subprocess.run(
        command, capture_output=True, text=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""}
    )
    expected = optimized_nodes(folder)
    record = json.loads(record_path.read_text())
    assert [r["batch"] for r in record["results"]] == [1, 2]
    for r in record["results"]:
        assert (r["source"], r["num_runs"], r["devices"]) == ("host", 6, "cpu,cpu")
        assert Counter((n["node"], n["op"]) for n in r["nodes"]) == expected
        assert all(n["calls"] == pytest.approx(1.0) for n in r["nodes"])
        assert {o["op"]: o["nodes"] for o in r["ops"]} == dict(Counter(op for _, op in expected))
        assert r["copies"]["MemcpyFromHost"]["calls"] == r["copies"]["MemcpyToHost"]["calls"] == 0
        assert 0 < r["kernel_us"] < r["run_us"]
    assert result.stdout.count("Timed by: HOST time of each node's kernel call") == 2
    assert result.stdout.count("Top 4 nodes:") == 2


# -- prefix_cuts.py: a layer's segments between cuts -------------------------------------------
def diamond():  # type: ignore[no-untyped-def]
    """x -> A -> B, x -> C, D = B + C -> E, listed A, C, B, D, E (an order that interleaves branches)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="/l0/A"),
        helper.make_node("Abs", ["x"], ["c"], name="/l0/C"),
        helper.make_node("Neg", ["a"], ["b"], name="/l0/B"),
        helper.make_node("Add", ["b", "c"], ["d"], name="/l1/D"),
        helper.make_node("Relu", ["d"], ["e"], name="/l1/E"),
    ]
    vector = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("x", "e")]
    graph = helper.make_graph(nodes, "diamond", vector[:1], vector[1:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_cuts_follow_the_demand_order_and_join_side_branches_to_the_node_that_meets_them():
    cuts = dominator_cuts(diamond().graph, "e", "/l1/")
    # A, B each dominate what came before them; C does not (B is not its ancestor): C joins D
    assert [(c.value, [name for name, _ in c.nodes]) for c in cuts] == [
        ("b", ["/l0/B"]),
        ("d", ["/l0/C", "/l1/D"]),
        ("e", ["/l1/E"]),
    ]
    assert [c.value for c in dominator_cuts(diamond().graph, "e", "/l0/")] == ["a", "b"]
    with pytest.raises(ValueError, match="no cut in the nodes named /l2/"):
        dominator_cuts(diamond().graph, "e", "/l2/")


def test_a_cut_graph_holds_the_nodes_asked_for_and_is_fed_what_they_read_from_outside():
    import numpy as np
    import onnx
    import onnxruntime as ort

    a = np.array([-1.0, 0.5, 2.0], np.float32)
    cut = onnx.load_from_string(sub_model(diamond(), 0b100, {"a": a}, ["b"]))  # node 2: B
    assert [n.name for n in cut.graph.node] == ["/l0/B"] and [i.name for i in cut.graph.input] == ["a"]
    assert [o.name for o in cut.graph.output] == ["b"]
    (b,) = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    assert b.tolist() == [1.0, -0.5, -2.0]


@pytest.mark.slow  # the tiny fp32 export in one partition, a subprocess timing ~60 prefix graphs: ~15 s
def test_a_layers_segments_hold_each_of_its_nodes_once(tiny_export, tmp_path):
    import onnx

    folder, _ = tiny_export()
    record_path = tmp_path / "cuts.json"
    command = [sys.executable, str(REPO / "tools" / "profile_ops.py"), "--model-dir", str(folder), "--batch", "1"]
    command += ["--context", "12", "--steps", "1", "--cuts", "1", "--cut-reps", "1", "--json", str(record_path)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert result.returncode == 0, result.stderr[-2000:]
    (r,) = json.loads(record_path.read_text())["results"]
    segments = r["cuts"]["segments"]
    graph = onnx.load(str(folder / "part-00.onnx"), load_external_data=False).graph
    layer = sorted(n.name for n in graph.node if n.name.startswith("/model/layers.1/"))
    assert segments[0]["nodes"] == [["/model/layers.0/mlp_residual", "Add"]]  # the cut before the layer
    assert sorted(name for s in segments[1:] for name, _ in s["nodes"]) == layer
    assert segments[-1]["value"] == "/model/layers.1/mlp_residual/output_0"
    assert "layer 1 between cuts" in result.stdout
