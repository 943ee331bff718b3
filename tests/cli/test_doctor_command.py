"""`wicore doctor` on a tiny export: ONNX Runtime's placement on the CPU EP, the CUDA EP's published
list, an EP without a list, and bad input (one line, exit 2)."""

from __future__ import annotations

import onnx
import pytest

from wicore.cli.main import main

CUDA_LIST = (
    "CUDAExecutionProvider [published list: https://github.com/microsoft/onnxruntime/blob/"
    "001d12d2623fd411ce0f83d05abb5e82304a3389/docs/OperatorKernels.md (ONNX Runtime main, commit 001d12d2623f, "
    "taken 2026-11-27)]"
)


def doctor(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.mark.slow  # the tiny export: ~15 s once a session
def test_a_tiny_export_on_the_cpu_ep_and_on_two_eps_not_installed(tiny_export, capsys):
    folder, _ = tiny_export()
    graph = onnx.load(str(folder / "part-00.onnx"), load_external_data=False).graph
    # ORT reports its placement after its basic optimizations: the two ropes' Cast and Unsqueeze of
    # the positions are the same nodes, merged into one (common subexpression elimination)
    repeated = repeated_nodes(graph)
    assert len(graph.node) == 436 and [name.rsplit("/", 1)[1] for name in repeated] == ["pos_f", "pos_u"]
    mods = [n.name for n in graph.node if n.op_type == "Mod"]
    assert len(mods) == 2 and all(n.name.endswith("slot_offset") for n in graph.node if n.op_type == "Mod")
    code, lines, _ = doctor(capsys, str(folder), "--ep", "cpu,cuda,dml", "--ep", "TensorrtExecutionProvider")
    assert code == 0
    assert lines == [
        f"{folder}: 1 graph (part-00.onnx)",
        "",
        "CPUExecutionProvider [ORT placement (onnxruntime " + onnx_runtime_version() + ")]",
        "  part-00.onnx: all 434 nodes on CPUExecutionProvider",
        "",
        CUDA_LIST,
        "  part-00.onnx: all 436 nodes on CUDAExecutionProvider, by its list",
        "",
        CUDA_LIST.replace("CUDAExecutionProvider", "DmlExecutionProvider"),
        # DirectML's Mod takes no int64 (docs/OperatorKernels.md); the graph's Mod nodes are its block arithmetic
        f"  part-00.onnx: {len(mods)} of 436 nodes fall back to the CPU: Mod (int64) x{len(mods)}",
        f"    {'Mod (int64)':<32} x{len(mods):<5} not in its list (this op, or this type): {', '.join(mods)}",
        "",
        "TensorrtExecutionProvider [published list: none]",
        "  part-00.onnx: unknown for all 436 nodes: no published operator list of TensorrtExecutionProvider is kept in WiCore",
    ]


def repeated_nodes(graph: onnx.GraphProto) -> list[str]:
    """Nodes that compute what an earlier node does: same op, same attributes, same inputs (after merging)."""
    seen: dict[tuple, list[str]] = {}
    same: dict[str, str] = {}
    repeated = []
    for node in graph.node:
        key = (
            node.domain,
            node.op_type,
            tuple(same.get(i, i) for i in node.input),
            tuple(a.SerializeToString() for a in node.attribute),
        )
        if key in seen:
            repeated.append(node.name)
            same.update(zip(node.output, seen[key]))
        else:
            seen[key] = list(node.output)
    return repeated


def onnx_runtime_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def test_a_missing_model_folder_is_one_line_and_exit_2(tmp_path, capsys):
    code, lines, err = doctor(capsys, str(tmp_path / "nowhere"))
    assert (code, lines) == (2, [])
    assert (
        err
        == f"wicore: error: {tmp_path / 'nowhere'}: no such model folder; give an exported model's folder or a packaged name\n"
    )


def test_a_folder_that_is_no_export_is_one_line_and_exit_2(tmp_path, capsys):
    code, lines, err = doctor(capsys, str(tmp_path))
    assert (code, lines) == (2, [])
    assert err.startswith(f"wicore: error: {tmp_path}: no exported model here (no wicore.json)") and err.count("\n") == 1


def test_an_unknown_ep_is_one_line_and_exit_2(tmp_path, capsys):
    code, lines, err = doctor(capsys, str(tmp_path), "--ep", "cuda,tpu")
    assert (code, lines) == (2, [])
    assert err == (
        "wicore: error: --ep tpu: unknown execution provider; known: cpu, cuda, tensorrt, openvino, migraphx, cann, dml, "
        "webgpu, coreml, qnn, rocm (or 'all')\n"
    )


@pytest.mark.slow  # the tiny export
def test_the_sampling_head_built_at_load_is_a_graph_of_its_own(tiny_export, tmp_path, capsys):
    import json

    from wicore.graph.sampling import head_model

    folder, _ = tiny_export()
    copy = tmp_path / "with-head"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).symlink_to(path)
    (copy / "wicore.json").unlink()
    manifest = json.loads((folder / "wicore.json").read_text())
    (copy / "wicore.json").write_text(json.dumps({**manifest, "sampling_head": True}))
    head = head_model(manifest["config"]["vocab_size"]).graph
    code, lines, _ = doctor(capsys, str(copy), "--ep", "cuda")
    assert code == 0
    assert lines[0] == f"{copy}: 2 graphs (part-00.onnx, sampling head (built at load))"
    assert lines[-1] == f"  sampling head (built at load): all {len(head.node)} nodes on CUDAExecutionProvider, by its list"
