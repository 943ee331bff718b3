"""wicore.MatMulI8 (float16 x, int8 weights a scale per output channel) on its CPU kernel against the NumPy
statement of its arithmetic (wicore/graph/matmul_i8.py `reference`): above 16 rows the same bits, at or below
within float32's summation error. The CUDA kernels are checked against the same reference on a GPU by
tools/check_matmul_i8_gpu.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.graph.matmul_i8 import GEMV_ROWS, dense, quantize_channels, quantize_rows, reference
from wicore.kernels.library import DOMAIN


def op_model(codes: np.ndarray, scales: np.ndarray, x_shape: list) -> bytes:
    n, k = codes.shape
    node = helper.make_node("MatMulI8", ["x", "w", "scales"], ["y"], domain=DOMAIN, K=k, N=n)
    graph = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [onnx.numpy_helper.from_array(codes, "w"), onnx.numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def run_op(library: str, x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library)
    s = ort.InferenceSession(op_model(codes, scales, list(x.shape)), opts, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def weights(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes, scales = quantize_channels(rng.normal(0, 0.05, (n, k)).astype(np.float32))
    codes[3, :] = -127  # both ends of the range, and a zero row (scale 0)
    codes[4, :] = 127
    codes[5, :], scales[5] = 0, 0.0
    return codes, scales


@pytest.mark.parametrize("rows", [(1,), (16,), (17,), (3, 100)])
@pytest.mark.parametrize("k", [48, 272])  # multiples of 16, not of 32
def test_matmul_i8_computes_its_reference(cpu_library, rows, k):
    """Above 16 rows the int8 path: bit-equal to the reference; at 16 or fewer the weight-only path: float32
    sums of float16 x times the codes, within a float16 rounding of the float64 product."""
    n = 36
    codes, scales = weights(n, k, k)
    rng = np.random.default_rng(len(rows) + k)
    x = rng.normal(0, 1, (*rows, k)).astype(np.float16)
    x.reshape(-1, k)[-1] = 0  # a zero row of x (scale 0)
    x.reshape(-1, k)[0, 7] = 40.0  # an outlier
    y = run_op(cpu_library, x, codes, scales)
    want = reference(x, codes, scales)
    assert y.dtype == np.float16 and y.shape == (*rows, n)
    if int(np.prod(rows)) > GEMV_ROWS:
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    else:
        exact = (x.reshape(-1, k).astype(np.float64) @ codes.astype(np.float64).T) * scales.astype(np.float64)
        bound = (
            np.abs(exact) * 2.0**-11
            + np.abs(x.reshape(-1, k).astype(np.float64)) @ np.abs(codes.T.astype(np.float64)) * scales * 1e-6
        )
        assert (np.abs(y.reshape(-1, n).astype(np.float64) - exact) <= bound + 2.0**-24).all()


def test_integer_valued_products_are_exact(cpu_library):
    """x whose rows already are int8 steps (a row's largest |x| 127, integers) and unit scales: the int32 sums
    come out unrounded, y = Σ x code exactly (each |y| below 2048, a float16 integer)."""
    n, k, m = 8, 16, 20
    rng = np.random.default_rng(3)
    x = rng.integers(-127, 128, (m, k)).astype(np.float16)
    x[:, 0] = 127
    codes = rng.integers(-1, 2, (n, k)).astype(np.int8)
    y = run_op(cpu_library, x, codes, np.ones(n, np.float32))
    want = x.astype(np.int64) @ codes.T.astype(np.int64)
    assert np.abs(want).max() < 2048
    np.testing.assert_array_equal(y.astype(np.int64), want)


def test_rows_round_half_to_even():
    """quantize_rows: amax 127 makes x * (127 / amax) = x, so halves show the rounding: 2.5 -> 2, 3.5 -> 4, -0.5 -> 0."""
    x = np.array([[127, 2.5, 3.5, -0.5, -1.5] + [0] * 11], np.float16)
    q, s = quantize_rows(x)
    assert q[0, :5].tolist() == [127, 2, 4, 0, -2] and s.tolist() == [1.0]


def test_matmul_i8_refuses_k_not_a_multiple_of_16(cpu_library):
    codes, scales = np.ones((4, 40), np.int8), np.ones(4, np.float32)
    with pytest.raises(Exception, match="K must be a positive multiple of 16"):
        run_op(cpu_library, np.ones((1, 40), np.float16), codes, scales)


def test_block_sources_are_dequantized_before_the_channels_are():
    """A weight a source hands as blocks (RandomQuantSource's floats are zeros) is quantized per channel from
    its blocks' values, not from the zeros; a float weight from itself; parts stacked by rows."""
    from wicore.export.random_weights import RandomQuantSource
    from wicore.model.quant import QuantizedTensor

    source = RandomQuantSource.__new__(RandomQuantSource)
    source.bits, source.block_size, source.seed = 8, 32, 0
    blocked = source.linear("w", (8, 64))
    assert isinstance(blocked, QuantizedTensor) and not np.asarray(blocked).any()
    plain = np.random.default_rng(1).normal(0, 0.02, (4, 64)).astype(np.float32)
    w = dense([blocked, plain])
    np.testing.assert_array_equal(w[:8], source.blocks("w", (8, 64)).dequantize())
    np.testing.assert_array_equal(w[8:], plain)
    codes, scales = quantize_channels(w)
    assert np.abs(codes).max(axis=1).tolist() == [127] * 12  # each row's largest weight is a whole step
    assert (np.abs(codes * scales[:, None] - w) <= scales[:, None] / 2 * (1 + 1e-6)).all()


def test_the_cuda_build_has_cublaslt_only_where_its_header_is(tmp_path, monkeypatch):
    """-DWICORE_CUBLASLT and the header's folder where cublasLt.h is found ($WICORE_CUBLASLT_INCLUDE first); without
    one (a toolkit without cuBLAS) the command builds every op as before, MatMulI8 then saying what is missing."""
    from pathlib import Path

    import wicore.kernels.library as lib

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    header = tmp_path / "h"
    header.mkdir()
    (header / "cublasLt.h").write_text("")
    monkeypatch.setenv(lib.CUBLASLT_ENV, str(header))
    assert lib.find_cublaslt_include(tmp_path / "cuda") == header
    command = lib.Compiler(nvcc, True).command(Path("out.so"))
    assert "-DWICORE_CUBLASLT" in command and f"-I{header}" in command
    monkeypatch.setattr(lib, "find_cublaslt_include", lambda toolkit: None)
    command = lib.Compiler(nvcc, True).command(Path("out.so"))
    assert "-DWICORE_CUBLASLT" not in command and any(c.endswith("matmul_i8.cu") for c in command)
