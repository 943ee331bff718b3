"""tools/profile_ops.py on the WebGPU plugin EP (lavapipe without a GPU: only the table's structure
is checked, never a time): the tiny Gemma 3's paged webgpu export, uncaptured, at 1 and 3 rows.

Run as the rest of the WebGPU suite (tests/portability/test_webgpu.py says how and why the
environment variable is the caller's):

    ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 python -m pytest -ra -m webgpu tests/portability
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest

from tests.portability.test_webgpu import why_no_webgpu

pytestmark = [pytest.mark.webgpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 20  # each row's 20 prompt tokens and the ~8 it decodes while timed lie in KV blocks 0 and 1 of 16
BLOCK_SIZE = 16  # the WebGPU EP's PagedAttention takes blocks of 16 tokens and up


@pytest.fixture(scope="module", autouse=True)
def webgpu() -> None:
    reason = why_no_webgpu()
    if reason is not None:
        pytest.skip(f"WEBGPU NOT TESTED: {reason}")


def optimized_nodes(model: Path, tmp_path: Path) -> Counter:
    """(node name, op type) of ONNX Runtime's optimized graph of `model` on WebGPU, with the engine's options."""
    from wicore.devices.providers import onnxruntime, parse_device, session_options

    device = parse_device("webgpu")
    options = session_options(2, devices=[device])
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime().InferenceSession(str(model), sess_options=options, providers=device.providers())
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    return Counter((n.name, n.op_type) for n in graph.node)


def test_the_paged_webgpu_step_is_every_node_once_on_the_hosts_clock_and_two_table_copies(tmp_path, tiny_model):
    """Every node of the optimized graph once a graph run, timed on the host: the onnxruntime-ep-webgpu
    0.4.0 plugin hands ONNX Runtime no profiler, so no GPU timestamps (a plugin that does fails here:
    then read its GPU table). Uncaptured, a run copies the paged graphs' two int32 block tables, global
    and sliding, [rows, 2 blocks] each (wicore/graph/paged_attention.py), and nothing back. `--cuts 1`:
    layer 1's segments hold each of its nodes once."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    folder, _ = tiny_model()
    export = tmp_path / "model"
    config = ExportConfig(dtype="fp16", op_flavour="webgpu", attention="paged")
    export_model(open_source(str(folder)), export, config, progress=lambda _: None)
    record_path = tmp_path / "ops.json"
    command = [sys.executable, str(ROOT / "tools" / "profile_ops.py"), "--model-dir", str(export), "--devices", "webgpu"]
    command += ["--batch", "1,3", "--context", str(CONTEXT), "--block-size", str(BLOCK_SIZE), "--steps", "2"]
    command += ["--cuts", "1", "--cut-reps", "1", "--json", str(record_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = optimized_nodes(export / "part-00.onnx", tmp_path)
    graph = onnx.load(str(export / "part-00.onnx"), load_external_data=False).graph
    layer = sorted(n.name for n in graph.node if n.name.startswith("/model/layers.1/"))
    assert Counter(op for _, op in expected)["MemcpyFromHost"] == 2
    results = json.loads(record_path.read_text())["results"]
    assert [(r["batch"], r["devices"], r["source"], r["num_runs"]) for r in results] == [
        (1, "webgpu:0", "host", 4),
        (3, "webgpu:0", "host", 4),
    ]
    for r in results:
        assert Counter((n["node"], n["op"]) for n in r["nodes"]) == expected
        assert all(n["calls"] == pytest.approx(1.0) for n in r["nodes"])
        rows = r["batch"]
        assert sorted(r["copy_shapes"].values()) == [[{"int32": [rows, 2]}]] * 2
        assert r["copies"]["MemcpyFromHost"]["calls"] == pytest.approx(2.0)
        assert r["copies"]["MemcpyFromHost"]["bytes"] == pytest.approx(2 * rows * 2 * 4)
        assert r["copies"]["MemcpyToHost"]["calls"] == 0
        segments = r["cuts"]["segments"]  # layer 1: the cut before it, then each of its nodes in one segment
        assert segments[0]["nodes"] == [["/model/layers.0/mlp_residual", "Add"]]
        assert sorted(name for s in segments[1:] for name, _ in s["nodes"]) == layer
        assert len(segments) == 26  # 25 cuts in the layer: only the q/k norms' branches join in one
    assert result.stdout.count("Timed by: HOST time of each node's kernel call (on a GPU EP") == 2
