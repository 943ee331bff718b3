"""graph/skip_norm.py: one SkipSimplifiedLayerNormalization node against NumPy's add and RMS norm."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from wicore.devices.providers import onnxruntime
from wicore.graph.ops import Graph
from wicore.graph.skip_norm import skip_rms_norm


def test_skip_rms_norm_gives_the_norm_of_the_sum_and_the_sum(tmp_path):
    rng = np.random.default_rng(0)
    x, h = (rng.standard_normal((2, 3, 64)).astype(np.float32) for _ in range(2))
    weight = rng.uniform(0.5, 1.5, 64)
    g = Graph("skip")
    for name in ("x", "h"):
        g.input(name, TensorProto.FLOAT, ["b", "s", 64])
    normed, total = skip_rms_norm(g, "x", "h", weight, 1e-6, "/norm")
    g.output(normed, TensorProto.FLOAT, ["b", "s", 64])
    g.output(total, TensorProto.FLOAT, ["b", "s", 64])
    onnx.save_model(g.to_model(17), tmp_path / "skip.onnx")
    ort = onnxruntime()
    sess = ort.InferenceSession(str(tmp_path / "skip.onnx"), providers=["CPUExecutionProvider"])
    got_normed, got_total = sess.run([normed, total], {"x": x, "h": h})
    s = x + h
    np.testing.assert_array_equal(got_total, s)  # the residual stream: the Add's float32 sum exactly
    expected = s / np.sqrt(np.mean(s.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6) * weight
    np.testing.assert_allclose(got_normed, expected, rtol=1e-5, atol=1e-6)
