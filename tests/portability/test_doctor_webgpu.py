"""`wicore doctor` on the WebGPU plugin EP: ONNX Runtime's real placement, checked against the kernels the
plugin registers (onnxruntime.capi._pybind_state.get_registered_ep_kernel_defs).

Each test runs doctor in a process of its own with ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1, so that a
CPU adapter (Mesa >= 25's lavapipe) counts there and nowhere else; where the plugin or an adapter is
missing, it is skipped and says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

pytestmark = [pytest.mark.webgpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MESA = (
    "without a GPU, install mesa-vulkan-drivers and libvulkan1 from bookworm-backports (Mesa >= 25: lavapipe); "
    "this test sets ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 in its own process"
)
# In the child: doctor's report of each graph as JSON, with the element types the plugin's kernel for
# each op that fell back takes (an oracle apart from the placement).
CHILD = """
import json, sys
import onnx
from wicore.devices.providers import installed_providers
if "WebGpuExecutionProvider" not in installed_providers():
    print(json.dumps({"skip": "the WebGPU plugin offers no device here"}))
    sys.exit(0)
from onnxruntime.capi._pybind_state import get_registered_ep_kernel_defs
from wicore.devices.doctor import session_placement
kernels = {}
for k in get_registered_ep_kernel_defs("WebGpuExecutionProvider"):
    if k.version_range[1] >= 2**31 - 1:
        deciding = k.type_constraints.get("T") or k.type_constraints.get("T1") or []  # the data's, not Tind's
        kernels.setdefault(k.op_name, set()).update(t[7:-1] for t in deciding)
out = []
for path in sys.argv[1:]:
    report = session_placement(path, onnx.load(path, load_external_data=False), path, "WebGpuExecutionProvider", None)
    groups = [[g.op_type, g.dtype, g.reason, len(g.names), sorted(kernels.get(g.op_type, ()))] for g in report.fallbacks]
    out.append({"verdict": report.verdict(), "groups": groups, "error": report.error})
print(json.dumps({"reports": out}))
"""


def doctor_on_webgpu(*paths: Path) -> list[dict]:
    try:
        import onnxruntime_ep_webgpu  # noqa: F401
    except ImportError:
        pytest.skip("WEBGPU NOT TESTED: onnxruntime-ep-webgpu is not installed (pip install '.[webgpu]')")
    env = {**os.environ, "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in answer:
        pytest.skip(f"WEBGPU NOT TESTED: {answer['skip']}: {MESA}")
    if any(r["error"] for r in answer["reports"]):
        pytest.skip(f"WEBGPU NOT TESTED: a WebGPU session failed ({answer['reports'][0]['error']}): {MESA}")
    return answer["reports"]


def test_an_int64_mul_falls_back_and_a_float_add_stays(tmp_path):
    f = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b", "total")]
    i64 = [helper.make_tensor_value_info(n, TensorProto.INT64, [4]) for n in ("d", "e", "product")]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["total"], name="add"),
        helper.make_node("Mul", ["d", "e"], ["product"], name="mul"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "two", [f[0], f[1], i64[0], i64[1]], [f[2], i64[2]]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    (report,) = doctor_on_webgpu(path)
    assert report["verdict"] == "1 of 2 nodes fall back to the CPU: Mul (int64) x1"
    (group,) = report["groups"]
    assert "int64" not in group[4] and "float" in group[4]  # the plugin's Mul: float16, float, int32, uint32


def test_every_fallback_of_a_tiny_export_is_a_type_the_plugin_has_no_kernel_for_or_a_move_ort_made(tiny_export):
    from wicore.devices.doctor import NO_KERNEL, SHAPE_MATH

    folder, _ = tiny_export()
    (report,) = doctor_on_webgpu(folder / "part-00.onnx")
    assert report["groups"], report["verdict"]
    for op, dtype, reason, _, kernel_types in report["groups"]:
        if reason == NO_KERNEL:
            assert dtype not in kernel_types, (op, dtype, kernel_types)
        else:
            assert reason == SHAPE_MATH and dtype in kernel_types, (op, dtype, kernel_types)
    assert {(op, dtype) for op, dtype, reason, _, _ in report["groups"] if reason == NO_KERNEL} >= {
        ("Range", "int64"),
        ("Mod", "int64"),
    }
