"""What WiCore's mixture-of-experts graph costs on the CPU against computing every expert.

One expert layer (router, softmax, top-k, experts) in three ONNX formulations (five with --bits), timed on
the CPU EP at a decode step (1 token) and prefill chunks:

    routed   wicore.graph.moe: each expert on the tokens routed to it (the exported graphs)
    ort-moe  ONNX Runtime's com.microsoft.MoE kernel (what the paged graphs use on CUDA)
    with --bits: routed-qN (per-expert MatMulNBits) and qmoe-qN (com.microsoft.QMoE, the ort-quant
             exports' kernel), int8 activations: their |diff| is the quantization's
    dense    every expert on every token (one batched MatMul over stacked weights), weighted by
             the routing with zeros off the top k: E / k times the arithmetic and weight reads

    python tools/bench_moe.py --experts 64 --top-k 8 --hidden 1024 --expert-width 384 --threads 2

The float ones give the same output (max |diff| against dense printed, per variant); the shape defaults to Qwen3-30B-A3B's
ratios (E / k = 8 ... 16) at a size a 2-core machine times in seconds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from wicore.graph.decoder import OPSET, DecoderBuilder
from wicore.graph.moe import moe
from wicore.graph.ops import DataFile, Graph, silu
from wicore.graph.quant import QuantLinear
from wicore.model.config import FULL, DecoderConfig
from wicore.model.weights import LayerWeights


def config(args: argparse.Namespace) -> DecoderConfig:
    return DecoderConfig(
        vocab_size=16, hidden_size=args.hidden, intermediate_size=args.expert_width, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=2, layer_types=(FULL,), sliding_window=16, family="qwen3_moe",
        num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.expert_width,
    )  # fmt: skip


def weights(cfg: DecoderConfig, seed: int = 0) -> LayerWeights:
    rng = np.random.default_rng(seed)
    h, w = cfg.hidden_size, cfg.moe_intermediate_size
    tensors = {"mlp.router": rng.standard_normal((cfg.num_experts, h), np.float32) * 0.05}
    for e in range(cfg.num_experts):
        for name, shape in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w))):
            tensors[f"mlp.experts.{e}.{name}"] = rng.standard_normal(shape, np.float32) * 0.03
    return LayerWeights(0, tensors)


def routed_graph(
    cfg: DecoderConfig, layer: LayerWeights, data: DataFile, kernel: str = "graph", bits: int | None = None
) -> onnx.ModelProto:
    g = Graph("routed", data)
    x = g.input("x", TensorProto.FLOAT, ["batch", "seq", cfg.hidden_size])
    quant = None if bits is None else QuantLinear(weight_bits=bits)
    g.op("Identity", [moe(DecoderBuilder(cfg, "fp32", quant=quant, expert_kernel=kernel), g, layer, x)], "/out", out="y")
    g.output("y", TensorProto.FLOAT, ["batch", "seq", cfg.hidden_size])
    return g.to_model(OPSET)


def dense_graph(cfg: DecoderConfig, layer: LayerWeights, data: DataFile) -> onnx.ModelProto:
    """Every expert on every token: [E, N, H] x [E, H, 2W] -> ... -> [E, N, H], summed with the routing."""
    g = Graph("dense", data)
    e_, k, h, w = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    x = g.input("x", TensorProto.FLOAT, ["batch", "seq", h])
    rows = g.op("Reshape", [x, g.const([-1, h])], "/rows")
    router = g.weight("router", np.ascontiguousarray(layer["mlp.router"].T))
    probs = g.op("Softmax", [g.op("MatMul", [rows, router], "/router")], "/softmax", axis=-1)
    top_p, top_e = g.op_multi("TopK", [probs, g.const([k])], "/topk", 2, axis=-1)
    top_p = g.op("Div", [top_p, g.op("ReduceSum", [top_p, g.const([-1])], "/sum_p", keepdims=1)], "/renorm")
    zeros = g.op("Mul", [probs, g.const(np.float32(0), np.float32)], "/zeros")
    routing = g.op("ScatterElements", [zeros, top_e, top_p], "/routing", axis=1)  # [N, E]
    stack = lambda name, t: np.ascontiguousarray(np.stack([layer[f"mlp.experts.{i}.{name}"].T for i in range(e_)]))
    gate_up = g.weight("gate_up", np.concatenate([stack("gate_proj", 0), stack("up_proj", 0)], axis=2))  # [E, H, 2W]
    down = g.weight("down", stack("down_proj", 0))  # [E, W, H]
    a = g.op("MatMul", [rows, gate_up], "/gate_up")  # [E, N, 2W]
    gate, up = g.op_multi("Split", [a, g.const([w, w])], "/split", 2, axis=-1)
    y = g.op("MatMul", [g.op("Mul", [silu(g, gate, "/act"), up], "/mul"), down], "/down")  # [E, N, H]
    weight = g.op("Unsqueeze", [g.op("Transpose", [routing], "/routing_T", perm=[1, 0]), g.const([-1])], "/weight")
    y = g.op("ReduceSum", [g.op("Mul", [y, weight], "/weighted"), g.const([0])], "/sum", keepdims=0)
    g.op("Reshape", [y, g.op("Shape", [x], "/shape")], "/out", out="y")
    g.output("y", TensorProto.FLOAT, ["batch", "seq", h])
    return g.to_model(OPSET)


def session(model: onnx.ModelProto, folder: Path, name: str, threads: int):
    import onnxruntime as ort

    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_ms(sess, x: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    out = sess.run(None, {"x": x})[0]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, {"x": x})
        best = min(best, time.perf_counter() - start)
    return best * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--expert-width", type=int, default=384)
    ap.add_argument("--tokens", default="1,128", help="rows a run, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--bits", type=int, choices=(4, 8), default=None, help="also the quantized kernels (int8 activations)")
    args = ap.parse_args()
    cfg = config(args)
    layer = weights(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sessions = {}
        variants = {
            "routed": routed_graph,
            "ort-moe": lambda c, w, d: routed_graph(c, w, d, "ort-moe"),
            "dense": dense_graph,
        }
        if args.bits:  # the ort-quant flavour's two kernels: per-expert MatMulNBits, QMoE
            variants[f"routed-q{args.bits}"] = lambda c, w, d: routed_graph(c, w, d, "graph", args.bits)
            variants[f"qmoe-q{args.bits}"] = lambda c, w, d: routed_graph(c, w, d, "ort-moe", args.bits)
        for name, build in variants.items():
            data = DataFile(folder / f"{name}.bin")
            model = build(cfg, layer, data)
            data.close()
            sessions[name] = (session(model, folder, name, args.threads), len(model.graph.node))
        print(
            f"E={cfg.num_experts} k={cfg.num_experts_per_tok} H={cfg.hidden_size} W={cfg.moe_intermediate_size}, {args.threads} threads"
        )
        for n in (int(t) for t in args.tokens.split(",")):
            x = np.random.default_rng(1).standard_normal((1, n, cfg.hidden_size), np.float32)
            results = {name: time_ms(sess, x, args.repeats) for name, (sess, _) in sessions.items()}
            dense = results["dense"][1]
            cells = ", ".join(
                f"{name} {ms:.2f} ms ({sessions[name][1]} nodes, |diff| {float(np.abs(out - dense).max()):.1e})"
                for name, (ms, out) in results.items()
            )
            print(f"{n} tokens: {cells}; dense / routed {results['dense'][0] / results['routed'][0]:.2f}x")


if __name__ == "__main__":
    main()
