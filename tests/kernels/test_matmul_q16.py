"""wicore.MatMulQ16 (float16 x, MatMulNBits' 4- and 8-bit blocks) on its CPU kernel, against NumPy's dequantize
and matmul in float64 and against ONNX Runtime's MatMulNBits on the same initializers; and the float16
ort-quant exports with `kernels="wicore"` that place it (the CUDA flavour's int4 / int8 graphs). The CUDA
kernels are checked against this op on a GPU by tools/check_matmul_q16_gpu.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.graph.ops import MS_DOMAIN
from wicore.graph.quant import pack_codes
from wicore.kernels.library import DOMAIN
from wicore.model.quant import quantize_symmetric
from wicore.types.sampling import SamplingParams


def run_op(library: str, op: str, x: np.ndarray, b: np.ndarray, scales: np.ndarray, attrs: dict) -> np.ndarray:
    f16 = TensorProto.FLOAT16
    domain = MS_DOMAIN if op == "MatMulNBits" else DOMAIN
    node = helper.make_node(op, ["x", "b", "scales"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", f16, list(x.shape))],
        [helper.make_tensor_value_info("y", f16, None)],
        [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(MS_DOMAIN, 1)]
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library)
    s = ort.InferenceSession(
        helper.make_model(graph, opset_imports=opsets).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return s.run(None, {"x": x})[0]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("rows", "block_size"), [((1,), 32), ((2, 3), 64), ((0,), 32)])
def test_matmul_q16_is_the_dequantized_matmul(cpu_library, bits, rows, block_size):
    """y = x @ ((code - 2^(bits-1)) * scale)ᵀ: float32 sums, one rounding to half, so within half a float16 ulp
    of the float64 product plus float32's summation error; a weight row whose codes sit at both ends of the range."""
    n, k = 40, 256
    rng = np.random.default_rng(bits * block_size)
    w = quantize_symmetric(rng.normal(0, 0.05, (n, k)).astype(np.float32), bits, block_size)
    w.codes[3, :] = -(2 ** (bits - 1))  # the lowest code of every block of a row, then the highest
    w.codes[4, :] = 2 ** (bits - 1) - 1
    scales = w.scales.astype(np.float16)
    x = rng.normal(0, 1, (*rows, k)).astype(np.float16)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    y = run_op(cpu_library, "MatMulQ16", x, pack_codes(w), scales, attrs)
    dequantized = w.codes.astype(np.float64) * np.repeat(scales.astype(np.float64), block_size, axis=1)
    want = x.astype(np.float64) @ dequantized.T
    bound = np.abs(want) * 2.0**-11 + np.abs(x.astype(np.float64)) @ np.abs(dequantized).T * 1e-6 + 2.0**-25
    assert y.dtype == np.float16 and y.shape == (*rows, n)
    assert (np.abs(y.astype(np.float64) - want) <= bound).all()
    if y.size:  # the same inputs on ONNX Runtime's MatMulNBits: its layout, within its float16 rounding
        theirs = run_op(cpu_library, "MatMulNBits", x, pack_codes(w), scales, attrs)
        np.testing.assert_allclose(y.astype(np.float32), theirs.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_matmul_q16_refuses_blocks_below_32(cpu_library):
    w = quantize_symmetric(np.ones((8, 64), np.float32), 4, 16)
    attrs = {"K": 64, "N": 8, "bits": 4, "block_size": 16}
    with pytest.raises(Exception, match="block_size must be a multiple of 32"):
        run_op(cpu_library, "MatMulQ16", np.ones((1, 64), np.float16), pack_codes(w), w.scales.astype(np.float16), attrs)


def op_counts(folder: Path) -> dict[str, int]:
    manifest = Manifest.read(folder)
    counts: dict[str, int] = {}
    for part in manifest.partitions:
        for node in onnx.load(folder / part.file, load_external_data=False).graph.node:
            key = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.slow  # two float16 exports and engines of the tiny model
@pytest.mark.parametrize("bits", [4, 8])
def test_fp16_ort_quant_on_wicore_kernels_runs_matmul_q16(tiny_model, tmp_path, cpu_library, monkeypatch, bits):
    """The float16 int4 / int8 export with `--matmul-q16` has MatMulQ16 where MatMulNBits was (every linear
    layer and the head) and greedy-decodes the tokens of the MatMulNBits export on the CPU."""
    monkeypatch.setenv("WICORE_CACHE", str(Path(cpu_library).parents[2]))  # where the fixture built the library
    folder, _ = tiny_model()
    tokens = {}
    for kernels in ("wicore", "ort"):
        out = tmp_path / f"{kernels}{bits}"
        config = ExportConfig(
            op_flavour="ort-quant", weight_bits=bits, dtype="fp16", kernels=kernels, matmul_q16=kernels == "wicore"
        )
        export_model(open_source(str(folder)), out, config, progress=lambda _: None)
        counts = op_counts(out)
        if kernels == "wicore":
            layers = Manifest.read(out).config.num_layers
            assert "com.microsoft:MatMulNBits" not in counts
            assert counts[f"{DOMAIN}:MatMulQ16"] == 4 * layers + 1  # q|k|v, o, gate|up, down a layer; the head
        with Engine(EngineConfig(model_dir=out, num_threads=1, host_tier_gb=0)) as engine:
            completions = engine.generate([[1, 5, 9, 13, 2, 7]], SamplingParams(max_tokens=12, ignore_eos=True))
        tokens[kernels] = completions[0].token_ids
    assert len(tokens["wicore"]) == 12 and tokens["wicore"] == tokens["ort"]


def test_the_cuda_flavour_int4_export_places_matmul_q16_when_asked(tiny_model, tmp_path):
    """The paged float16 graphs with WiCore's kernels (the CUDA flavour) in 4 bits: MatMulNBits by default (MatMulQ16
    is slower above 16 rows), MatMulQ16 and no MatMulNBits with `matmul_q16`."""
    folder, _ = tiny_model()
    layers = None
    for matmul_q16 in (False, True):
        out = tmp_path / f"cuda4-{matmul_q16}"
        config = ExportConfig(
            op_flavour="ort-quant", weight_bits=4, dtype="fp16", attention="paged", kernels="wicore", matmul_q16=matmul_q16
        )
        export_model(open_source(str(folder)), out, config, progress=lambda _: None)
        counts = op_counts(out)
        layers = Manifest.read(out).config.num_layers
        on_q16, on_nbits = counts.get(f"{DOMAIN}:MatMulQ16", 0), counts.get("com.microsoft:MatMulNBits", 0)
        assert (on_q16, on_nbits) == ((4 * layers + 1, 0) if matmul_q16 else (0, 4 * layers + 1))


@pytest.mark.parametrize(
    "settings",
    [
        dict(op_flavour="ort-quant", weight_bits=4, dtype="fp16"),  # no --kernels wicore
        dict(op_flavour="ort-quant", weight_bits=4, kernels="wicore"),  # fp32: the CPU's MatMulQ graphs
        dict(dtype="fp16", attention="paged", kernels="wicore"),  # float weights
    ],
)
def test_matmul_q16_needs_wicore_kernels_fp16_and_quantized_weights(settings):
    with pytest.raises(WiCoreError, match="--matmul-q16 needs --kernels wicore, --dtype fp16 and quantized weights"):
        ExportConfig(matmul_q16=True, **settings)
