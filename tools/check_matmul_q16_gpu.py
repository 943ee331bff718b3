"""wicore.MatMulQ16 on the CUDA EP against ONNX Runtime's MatMulNBits on the same initializers, at the 27B
shape's linear layers: results (against float64 NumPy where small, against MatMulNBits everywhere) and us
a call, both replayed from CUDA graphs (tools/kernel_graphs.py `timed`).

    PYTHONPATH=/tmp/site:. python3 tools/check_matmul_q16_gpu.py --rows 1,8,64,256 --bits 4,8

Prints per layer, bits and rows: max |error| over the reference's scale, us for each op and the weight's
read rate (its codes and scales over the time); MatMulNBits twice, on its default kernels and on the CUTLASS
fpA_intB ones that WiCore's sessions turn on (ep.cuda.fpa_intb_gemm); exits 1 where an error passes 1e-2.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from kernel_graphs import LINEAR_27B, timed
from onnx import TensorProto, helper, numpy_helper

from wicore.devices.providers import onnxruntime
from wicore.graph.quant import pack_codes
from wicore.kernels.library import DOMAIN, library
from wicore.model.quant import quantize_symmetric

F16 = TensorProto.FLOAT16
LAYERS = LINEAR_27B


def op_model(op: str, n: int, k: int, bits: int, codes: np.ndarray, scales: np.ndarray) -> bytes:
    """One MatMulQ16 or MatMulNBits node (float activations: accuracy_level 0) over the codes and scales."""
    attrs: dict[str, int] = dict(K=k, N=n, bits=bits, block_size=32)
    if op == "MatMulNBits":
        attrs["accuracy_level"] = 0
    node = helper.make_node(op, ["x", "b", "scales"], ["y"], domain=DOMAIN if op == "MatMulQ16" else "com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "k",
        [helper.make_tensor_value_info("x", F16, ["m", k])],
        [helper.make_tensor_value_info("y", F16, None)],
        [numpy_helper.from_array(codes, "b"), numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,64,256")
    p.add_argument("--bits", default="4,8")
    p.add_argument("--repeats", type=int, default=100)
    args = p.parse_args(argv)
    ort = onnxruntime()
    t = time.perf_counter()
    path = str(library(cuda=True))
    print(f"library {path} ({time.perf_counter() - t:.1f} s)")
    rng = np.random.default_rng(0)
    worst = 0.0
    for bits in (int(b) for b in args.bits.split(",")):
        for name, n, k in [("small", 72, 256), *LAYERS]:
            w = quantize_symmetric(rng.normal(0, 0.02, (n, k)).astype(np.float32), bits, 32)
            codes, scales = pack_codes(w), w.scales.astype(np.float16)
            ours, theirs = (op_model(op, n, k, bits, codes, scales) for op in ("MatMulQ16", "MatMulNBits"))
            weight_bytes = codes.nbytes + scales.nbytes
            for rows in [int(r) for r in args.rows.split(",")] + ([3, 17, 100] if name == "small" else []):
                x = rng.normal(0, 1, (rows, k)).astype(np.float16)
                (y,), our_us = timed(ort, path, ours, {"x": x}, args.repeats)
                (y_ref,), their_us = timed(ort, path, theirs, {"x": x}, args.repeats)
                _, fpa_us = timed(ort, path, theirs, {"x": x}, args.repeats, {"ep.cuda.fpa_intb_gemm": "1"})
                scale = float(np.abs(y_ref.astype(np.float64)).max()) or 1.0
                err = float(np.abs(y.astype(np.float64) - y_ref).max()) / scale
                if name == "small":  # and against float64 NumPy
                    want = x.astype(np.float64) @ (w.codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, 1)).T
                    err = max(err, float(np.abs(y - want).max() / np.abs(want).max()))
                worst = max(worst, err if np.isfinite(err) else np.inf)
                print(
                    f"int{bits} {name:7s} N {n:5d} K {k:5d} rows {rows:3d}: rel err {err:.1e}; MatMulQ16 {our_us:8.1f} us "
                    f"({weight_bytes / our_us / 1e3:6.0f} GB/s), MatMulNBits {their_us:8.1f} us "
                    f"({weight_bytes / their_us / 1e3:6.0f} GB/s), with fpA_intB {fpa_us:8.1f} us; "
                    f"MatMulNBits / MatMulQ16 {their_us / our_us:.2f}x, {fpa_us / our_us:.2f}x with fpA_intB",
                    flush=True,
                )
    return 1 if worst > 1e-2 else 0


if __name__ == "__main__":
    sys.exit(main())
