"""WiCore's custom ops (wicore/kernels) on their CPU kernels, built here with the host's C++
compiler, against float64 references in NumPy; and the paged graphs that use them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.kernels.library import DOMAIN, KernelBuildError, find_compiler, has_cuda_kernels, library

EPS = 1e-6


def session(path: str, nodes: list, inputs: list, outputs: list) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "t", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def rms(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS)


def value(name: str, elem: int, shape: list) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize("post_norm", [False, True], ids=["AddRMSNorm", "NormAddRMSNorm"])
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (0, 16)])
@pytest.mark.slow  # 3 s on the 2-core VM, loaded
def test_residual_norm_is_the_sum_and_its_norm(cpu_library, post_norm, shape):
    hidden = shape[-1]
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    names = ["x", "h", "wp", "w"] if post_norm else ["x", "h", "w"]
    op = "NormAddRMSNorm" if post_norm else "AddRMSNorm"
    node = helper.make_node(op, names, ["y", "sum"], domain=DOMAIN, epsilon=EPS)
    types = {"x": (f32, list(shape)), "h": (f16, list(shape)), "wp": (f32, [hidden]), "w": (f16, [hidden])}
    s = session(cpu_library, [node], [value(n, *types[n]) for n in names], [value("y", f16, None), value("sum", f32, None)])
    rng = np.random.default_rng(hidden)
    feeds = {
        "x": rng.normal(0, 3, shape).astype(np.float32),
        "h": rng.normal(0, 2, shape).astype(np.float16),
        "wp": rng.normal(1, 0.5, hidden).astype(np.float32),
        "w": rng.normal(1, 0.5, hidden).astype(np.float16),
    }
    y, total = s.run(None, {n: feeds[n] for n in names})
    h = feeds["h"].astype(np.float64)
    want = feeds["x"] + (rms(h) * feeds["wp"] if post_norm else h)
    assert y.dtype == np.float16 and total.dtype == np.float32 and y.shape == total.shape == shape
    np.testing.assert_allclose(total, want, rtol=1e-5, atol=1e-5)
    want_y = rms(want) * feeds["w"].astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), want_y, rtol=2e-3, atol=2e-3)  # one float16 rounding


@pytest.mark.parametrize("op", ["GeGLU", "SwiGLU"])
@pytest.mark.parametrize("shape", [(4, 2 * 24), (2, 3, 2 * 7), (0, 8)])
def test_gated_activation_of_gate_and_up(cpu_library, op, shape):
    f16 = TensorProto.FLOAT16
    s = session(
        cpu_library,
        [helper.make_node(op, ["gu"], ["out"], domain=DOMAIN)],
        [value("gu", f16, list(shape))],
        [value("out", f16, None)],
    )
    gate_up = np.random.default_rng(1).normal(0, 2, shape).astype(np.float16)
    (out,) = s.run(None, {"gu": gate_up})
    inter = shape[-1] // 2
    g, u = gate_up[..., :inter].astype(np.float64), gate_up[..., inter:].astype(np.float64)
    act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) if op == "GeGLU" else g / (1 + np.exp(-g))
    assert out.dtype == np.float16 and out.shape == (*shape[:-1], inter)
    np.testing.assert_allclose(out.astype(np.float64), act * u, rtol=2e-3, atol=2e-3)


def test_halves_round_as_numpy_rounds_them(cpu_library):
    """The CPU kernels' float -> half rounding (subnormals, ties, overflow) is IEEE's, as NumPy's."""
    f16 = TensorProto.FLOAT16
    s = session(
        cpu_library,
        [helper.make_node("SwiGLU", ["gu"], ["out"], domain=DOMAIN)],
        [value("gu", f16, [1, None])],
        [value("out", f16, None)],
    )
    big = 30.0  # silu(30) ~ 30: out ~ 30 * up, so up spans the half range through the product
    ups = np.array([1e-8, 3e-8, 6e-8, 1e-6, 0.1, 0.3337, 1.0, 2184.0, 2185.0, 3000.0], np.float32)
    gate_up = np.concatenate([np.full(len(ups), big, np.float16), ups.astype(np.float16)])[None]
    (out,) = s.run(None, {"gu": gate_up})
    silu = np.float32(big) / (np.float32(1) + np.exp(np.float32(-big)))
    with np.errstate(over="ignore"):  # 30 * 3000 is past the half range: inf, as the kernel gives
        want = (silu * ups.astype(np.float16).astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out[0], want)
    assert np.isinf(out[0, -1]) and out[0, 0] == 0 and 0 < out[0, 1] < 6.1e-5  # inf, zero, a subnormal


@pytest.mark.slow  # a build of its own (~10 s on 2 cores)
@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 31, 32, 33, 65, 49152, 49163])
def test_argmax_rows_is_the_first_largest_entry_of_each_row(cpu_library, vocab):
    """wicore.ArgMaxRows is ONNX's ArgMax (axis -1, the first of equal largest entries) on logits without NaN:
    ties within a lane, across lanes and in the tail past the last 16 (AVX-512) or 32 (AVX2), and rows of -inf."""
    rng = np.random.default_rng(vocab)
    x = rng.standard_normal((2, 3, vocab)).astype(np.float32)
    top = np.float32(9.0)
    for row, spots in zip(x.reshape(6, vocab), ([0], [vocab - 1], [vocab // 2, vocab - 1], [3 % vocab, 19 % vocab], [], [])):
        row[spots] = top
    x[1, 1] = -np.inf
    x[1, 2] = np.float32(4.0)  # every entry equal
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    node = helper.make_node("ArgMaxRows", ["x"], ["y"], domain=DOMAIN)
    ours = session(cpu_library, [node], [value("x", f32, None)], [value("y", i64, None)]).run(None, {"x": x})[0]
    node = helper.make_node("ArgMax", ["x"], ["y"], axis=-1, keepdims=0)
    onnx_runtime = session(cpu_library, [node], [value("x", f32, None)], [value("y", i64, None)]).run(None, {"x": x})[0]
    assert ours.shape == (2, 3) and ours.dtype == np.int64
    assert ours.tolist() == x.argmax(-1).tolist() == onnx_runtime.tolist()
    assert ours[1, 1] == 0 and ours[1, 2] == 0


def test_the_library_is_built_once_and_has_no_cuda_kernels_without_nvcc(cpu_library, kernel_cache, monkeypatch):
    """The session's build (the cpu_library fixture's, into kernel_cache) is found, not built again:
    a second build of its own here cost ~30 s of the CI machine's two cores."""
    monkeypatch.setenv("WICORE_CACHE", str(kernel_cache))
    first = Path(cpu_library)
    mtime = first.stat().st_mtime_ns
    assert library(cuda=False) == first and first.stat().st_mtime_ns == mtime  # cached, not rebuilt
    assert first.parent.parent == kernel_cache / "kernels" and has_cuda_kernels(first) is False


def test_without_nvcc_a_cuda_build_says_what_to_install(monkeypatch, tmp_path):
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("this machine has a CUDA toolkit")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("WICORE_NVCC", raising=False)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if "nvidia" not in p])
    if find_compiler(cuda=True) is not None:
        pytest.skip("nvcc from a pip package is importable here")
    with pytest.raises(KernelBuildError, match=r"WiCore's kernels need CUDA's compiler nvcc \(a CUDA toolkit, or pip install"):
        library(cuda=True)


def test_a_paged_export_on_wicore_kernels_fuses_each_layers_residual(tiny_model, tmp_path):
    """Per layer: two fused residual norms and one GeGLU where ONNX Runtime's ops take four norms,
    two adds, a Split, a FastGelu and a Mul; the partition's last layer settles its MLP with a
    norm and an add. The manifest says the library is needed."""
    folder, _ = tiny_model()
    counts = {}
    for kernels in ("ort", "wicore"):
        out = tmp_path / kernels
        export_model(
            open_source(str(folder)), out, ExportConfig(dtype="fp16", attention="paged", kernels=kernels), progress=lambda _: None
        )
        manifest = Manifest.read(out)
        assert manifest.kernels == kernels
        import onnx

        nodes = onnx.load(out / manifest.partitions[0].file, load_external_data=False).graph.node
        counts[kernels] = {}
        for node in nodes:
            if node.name.startswith("/model/layers."):
                key = f"{node.domain}:{node.op_type}" if node.domain == DOMAIN else node.op_type
                counts[kernels][key] = counts[kernels].get(key, 0) + 1
    layers = manifest.config.num_layers
    assert counts["wicore"][f"{DOMAIN}:NormAddRMSNorm"] == 2 * layers - 1  # the first layer's first norm is plain
    assert counts["wicore"][f"{DOMAIN}:GeGLU"] == layers and "FastGelu" not in counts["wicore"]
    assert counts["ort"]["SimplifiedLayerNormalization"] == 4 * layers and counts["ort"]["Add"] == 2 * layers
    assert counts["wicore"]["SimplifiedLayerNormalization"] == 2  # the first input norm, the last post-norm
    assert counts["wicore"]["Add"] == 1
    assert counts["ort"]["Split"] == counts["wicore"].get("Split", 0) + layers


def test_wicore_kernels_need_the_paged_attention():
    with pytest.raises(WiCoreError, match="--kernels wicore needs --attention paged"):
        ExportConfig(kernels="wicore")
