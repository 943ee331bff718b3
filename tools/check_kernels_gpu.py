"""WiCore's CUDA kernels (wicore/kernels) one op at a time on the CUDA EP: results against float64
NumPy, and time a call against the ONNX Runtime ops they replace, both replayed from CUDA graphs.

    NormAddRMSNorm   vs  SimplifiedLayerNormalization (h, post weight) + Add + SimplifiedLayerNormalization
    GeGLU            vs  Split + FastGelu + Mul

    PYTHONPATH=/tmp/site:. python3 tools/check_kernels_gpu.py --hidden 5376 --inter 21504 --rows 1,64,256

Prints max |error| relative to the reference's scale per op and shape, and us a call (median of
replays, events around each); exits 1 where an error passes 1e-2.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from kernel_graphs import timed
from onnx import TensorProto, helper

from wicore.devices.providers import onnxruntime
from wicore.kernels.library import DOMAIN, library

EPS = 1e-6
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def model(nodes: list, inputs: list, outputs: list) -> bytes:
    graph = helper.make_graph(nodes, "k", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()  # ONNX Runtime 1.31 reads up to 13


def norm_models(hidden: int) -> tuple[bytes, bytes]:
    ins = [
        helper.make_tensor_value_info("x", F32, ["n", hidden]),
        helper.make_tensor_value_info("h", F16, ["n", hidden]),
        helper.make_tensor_value_info("wp", F32, [hidden]),
        helper.make_tensor_value_info("w", F16, [hidden]),
    ]
    outs = [helper.make_tensor_value_info("y", F16, None), helper.make_tensor_value_info("s", F32, None)]
    fused = model([helper.make_node("NormAddRMSNorm", ["x", "h", "wp", "w"], ["y", "s"], domain=DOMAIN, epsilon=EPS)], ins, outs)
    sln = dict(axis=-1, epsilon=EPS, stash_type=1)
    plain = model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["h", "wp"], ["hn"], **sln),
            helper.make_node("Add", ["x", "hn"], ["s"]),
            helper.make_node("SimplifiedLayerNormalization", ["s", "w"], ["y"], **sln),
        ],
        ins,
        outs,
    )
    return fused, plain


def gated_models(inter: int) -> tuple[bytes, bytes]:
    ins = [helper.make_tensor_value_info("gu", F16, ["n", 2 * inter])]
    outs = [helper.make_tensor_value_info("out", F16, None)]
    fused = model([helper.make_node("GeGLU", ["gu"], ["out"], domain=DOMAIN)], ins, outs)
    split = helper.make_tensor("split", TensorProto.INT64, [2], [inter, inter])
    nodes = [
        helper.make_node("Constant", [], ["sizes"], value=split),
        helper.make_node("Split", ["gu", "sizes"], ["g", "u"], axis=-1),
        helper.make_node("FastGelu", ["g"], ["a"], domain="com.microsoft"),
        helper.make_node("Mul", ["a", "u"], ["out"]),
    ]
    return fused, model(nodes, ins, outs)


def rms(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--inter", type=int, default=21504)
    p.add_argument("--rows", default="1,64,256")
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    ort = onnxruntime()
    t = time.perf_counter()
    path = str(library(cuda=True))
    print(f"library {path} ({time.perf_counter() - t:.1f} s)")
    rng = np.random.default_rng(0)
    worst = 0.0
    norm_fused, norm_plain = norm_models(args.hidden)
    gated_fused, gated_plain = gated_models(args.inter)
    for hidden, inter, rows in [(37, 13, 3)] + [(args.hidden, args.inter, int(r)) for r in args.rows.split(",")]:
        nf, npl = (norm_fused, norm_plain) if hidden == args.hidden else norm_models(hidden)
        gf, gp = (gated_fused, gated_plain) if inter == args.inter else gated_models(inter)
        feeds = {
            "x": rng.normal(0, 3, (rows, hidden)).astype(np.float32),
            "h": rng.normal(0, 2, (rows, hidden)).astype(np.float16),
            "wp": rng.normal(1, 0.5, hidden).astype(np.float32),
            "w": rng.normal(1, 0.5, hidden).astype(np.float16),
        }
        (y, s), fused_us = timed(ort, path, nf, feeds, args.repeats)
        _, plain_us = timed(ort, path, npl, feeds, args.repeats)
        want_s = feeds["x"] + rms(feeds["h"].astype(np.float64)) * feeds["wp"]
        want_y = rms(want_s) * feeds["w"].astype(np.float64)
        err = max(np.abs(s - want_s).max() / np.abs(want_s).max(), np.abs(y - want_y).max() / np.abs(want_y).max())
        worst = max(worst, err)
        print(
            f"NormAddRMSNorm rows {rows:4d} hidden {hidden:5d}: rel err {err:.1e}; {fused_us:7.1f} us, ORT's ops {plain_us:7.1f} us"
        )
        gu = rng.normal(0, 2, (rows, 2 * inter)).astype(np.float16)
        (out,), fused_us = timed(ort, path, gf, {"gu": gu}, args.repeats)
        _, plain_us = timed(ort, path, gp, {"gu": gu}, args.repeats)
        g, u = gu[:, :inter].astype(np.float64), gu[:, inter:].astype(np.float64)
        want = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
        err = np.abs(out - want).max() / np.abs(want).max()
        worst = max(worst, err)
        print(
            f"GeGLU          rows {rows:4d} inter  {inter:5d}: rel err {err:.1e}; {fused_us:7.1f} us, ORT's ops {plain_us:7.1f} us"
        )
    return 1 if worst > 1e-2 or not np.isfinite(worst) else 0


if __name__ == "__main__":
    sys.exit(main())
