"""wicore.MatMulI8 on the CUDA EP at the 27B shape's linear layers: its results against the NumPy statement of
its arithmetic (wicore/graph/matmul_i8.py `reference`: above 16 rows the same bits), and us a call replayed from
a CUDA graph (tools/kernel_graphs.py `timed`) against ONNX Runtime's MatMulNBits in 8 bits (the CUTLASS fpA_intB
kernels WiCore's sessions turn on, W8A16) and against a float16 MatMul (cuBLAS) of the same shape.

    PYTHONPATH=/tmp/site:.:tools python3 tools/check_matmul_i8_gpu.py --rows 1,8,64,256,1024 --json out.json
    PYTHONPATH=.:tools python3 tools/check_matmul_i8_gpu.py --device cpu   # the small case on the CPU kernel

Prints per layer and rows: the op's difference from the reference (above 16 rows: float16 values that differ,
expected 0; at or below: max |error| over the reference's scale), us for each op and the weight's read rate
(int8 codes and float32 scales, or float16, over the time); MatMulNBits and MatMul over MatMulI8. Exits 1 where
a result is off (bits differ above 16 rows, or a relative error past 1e-2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from kernel_graphs import LINEAR_27B as LAYERS
from kernel_graphs import timed
from onnx import TensorProto, helper, numpy_helper

from wicore.devices.providers import onnxruntime
from wicore.graph.matmul_i8 import GEMV_ROWS, reference
from wicore.kernels.library import DOMAIN, library

F16 = TensorProto.FLOAT16
SMALL = ("small", 72, 272)  # K a multiple of 16, not of 32; rows on both sides of the GEMV's 16


def one_node(op: str, inits: dict[str, np.ndarray], k: int, **attrs: int) -> bytes:
    """One node y = op(x, *inits) over x f16 [m, K] (MatMulI8 in WiCore's domain, MatMulNBits in Microsoft's,
    MatMul in ONNX's)."""
    domain = {"MatMulI8": DOMAIN, "MatMulNBits": "com.microsoft"}.get(op, "")
    node = helper.make_node(op, ["x", *inits], ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "k",
        [helper.make_tensor_value_info("x", F16, ["m", k])],
        [helper.make_tensor_value_info("y", F16, None)],
        [numpy_helper.from_array(v, name) for name, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def layer_weights(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random int8 codes (the full symmetric range) and channel scales of a 0.02-spread weight."""
    codes = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scales = (rng.random(n, dtype=np.float32) + 0.5) * np.float32(0.02 / 73)
    return codes, scales


def compare(y: np.ndarray, want: np.ndarray, rows: int) -> tuple[str, float, bool]:
    """('bits' or 'rel', the measure, whether it passes): above GEMV_ROWS the count of float16 values that differ."""
    scale = float(np.abs(want.astype(np.float64)).max()) or 1.0
    err = float(np.abs(y.astype(np.float64) - want).max()) / scale
    if rows > GEMV_ROWS:  # and where they differ, by how much
        differ = int(np.count_nonzero(y.view(np.uint16) != want.view(np.uint16)))
        return f"differ (rel err {err:.1e})", float(differ), differ == 0
    return "rel err", err, bool(np.isfinite(err) and err <= 1e-2)


def run_cpu(ort, path: str, model: bytes, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,64,256,1024")
    p.add_argument("--layers", default=",".join(name for name, _, _ in LAYERS), help="of " + ", ".join(n for n, _, _ in LAYERS))
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the small case on the CPU kernel, untimed")
    p.add_argument("--json", type=Path, help="the records, one a layer and row count")
    args = p.parse_args(argv)
    ort = onnxruntime()
    cuda = args.device == "cuda"
    t = time.perf_counter()
    path = str(library(cuda=cuda))
    print(f"library {path} ({time.perf_counter() - t:.1f} s)", flush=True)
    rng = np.random.default_rng(0)
    ok, records = True, []
    chosen = [layer for layer in LAYERS if layer[0] in args.layers.split(",")] if cuda else []
    for name, n, k in [SMALL, *chosen]:
        codes, scales = layer_weights(rng, n, k)
        ours = one_node("MatMulI8", {"w": codes, "scales": scales}, k, K=k, N=n)
        row_counts = [int(r) for r in args.rows.split(",")] + ([3, 16, 17, 100, 300] if name == "small" else [])
        if cuda:  # the same weights as MatMulNBits' 8-bit blocks and as a float16 [K, N] MatMul
            block_scales = np.repeat(scales.astype(np.float16)[:, None], k // 32, 1) if k % 32 == 0 else None
            packed = (codes.view(np.uint8) ^ 0x80).reshape(n, k // 32, 32) if block_scales is not None else None
            theirs = (
                one_node(
                    "MatMulNBits", {"b": packed, "scales": block_scales}, k, K=k, N=n, bits=8, block_size=32, accuracy_level=0
                )
                if packed is not None and block_scales is not None
                else None
            )
            dense = one_node(
                "MatMul", {"w": np.ascontiguousarray((codes.astype(np.float32) * scales[:, None]).T.astype(np.float16))}, k
            )
        for rows in row_counts:
            x = rng.normal(0, 1, (rows, k)).astype(np.float16)
            want = reference(x, codes, scales)
            record: dict[str, object] = {"layer": name, "n": n, "k": k, "rows": rows}
            if not cuda:
                y = run_cpu(ort, path, ours, x)
            else:
                (y,), us = timed(ort, path, ours, {"x": x}, args.repeats)
                _, fp16_us = timed(ort, path, dense, {"x": x}, args.repeats)
                record.update(i8_us=us, fp16_us=fp16_us, i8_gbps=(codes.nbytes + scales.nbytes) / us / 1e3)
                record.update(fp16_gbps=2 * n * k / fp16_us / 1e3)
                if theirs is not None:
                    _, nbits_us = timed(ort, path, theirs, {"x": x}, args.repeats, {"ep.cuda.fpa_intb_gemm": "1"})
                    record.update(nbits_us=nbits_us)
            kind, measure, passes = compare(y, want, rows)
            ok = ok and passes
            record.update({kind.split(" ")[0] if rows > GEMV_ROWS else "rel_err": measure, "kind": kind, "ok": passes})
            records.append(record)
            timing = ""
            if cuda:
                timing = (
                    f"; MatMulI8 {record['i8_us']:8.1f} us ({record['i8_gbps']:5.0f} GB/s), fp16 MatMul {record['fp16_us']:8.1f} us "
                    f"({record['fp16_gbps']:5.0f} GB/s) = {record['fp16_us'] / record['i8_us']:.2f}x"  # type: ignore[operator]
                )
                if "nbits_us" in record:
                    timing += f", MatMulNBits fpA_intB {record['nbits_us']:8.1f} us = {record['nbits_us'] / record['i8_us']:.2f}x"  # type: ignore[operator]
            print(
                f"{name:7s} N {n:6d} K {k:5d} rows {rows:4d}: {kind} {measure:.3g}{'' if passes else ' FAIL'}{timing}", flush=True
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"device": args.device, "library": path, "records": records}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
