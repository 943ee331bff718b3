"""The `webgpu` op flavour: the portable graphs written in the fused kernels ONNX Runtime's WebGPU EP has.

ONNX Runtime fuses the portable graphs' norm pattern (Pow, ReduceMean, Add, Sqrt, Div, Mul) into one
kernel for its built-in EPs, not for a plugin EP such as WebGPU, where those six ops a norm were ~16 ms
of a 51 ms step of the Gemma 3 1B shape on an H100 (docs/PERFORMANCE.md). This flavour writes the
fused ops into the graph itself (the decoder takes them with `fused_ops`, graph/decoder.py):

    norm                    SimplifiedLayerNormalization (ONNX domain, float32), its residual add
                            before it in com.microsoft.SkipSimplifiedLayerNormalization
                            (graph/skip_norm.py, pre-norm families)
    RoPE                    com.microsoft.RotaryEmbedding on the projections (graph/attention.py)
    GELU (tanh)             com.microsoft.FastGelu
    linear layers           float MatMuls, as portable (MatMulNBits is the ort-quant flavour's)

and does the index arithmetic of graph/shared_values.py in int32 (`IndexMath`): WGSL has no 64-bit
integers, and the EP takes none of Div, Mul, Sub, Less, Range, Concat, Unsqueeze on int64, so in the
portable graphs that arithmetic runs on the CPU and its results cross to the adapter in ~10 copies a
step (6.1 ms on the H100). What stays int64, and where ONNX Runtime runs it (docs/HARDWARE.md, WebGPU):

- the paging inputs themselves (wicore/graph/io.py: the executor feeds int64) and the block size:
  packed into one vector and cast to int32 on the CPU (the EP has no int64 Concat or Cast), reading
  the fed host arrays; that one vector is all that crosses to the adapter (`IndexMath.indices`),
  where the portable graphs copied ~10 values (6.1 ms a step on the H100);
- the token ids and the rows whose logits are read, Gather indices on the adapter as they come;
- shapes (Shape's output is int64 by definition) and their arithmetic (a count of blocks or
  tokens): scalars on the CPU, read by ops that take them in host memory (Reshape, Range, Split);
- ScatterND's and RotaryEmbedding's indices, int64 by their definitions: cast back from int32 on
  the adapter.

The CPU EP runs all of these ops too (the ort-quant flavour uses them), so a webgpu export also
runs there, giving the portable export's tokens (tests/portability/test_webgpu_flavour.py).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from wicore.graph.ops import Graph


class IndexMath:
    """Integer arithmetic on positions and slots in int64 (portable) or int32 (`int32`: the webgpu flavour)."""

    def __init__(self, g: Graph, int32: bool) -> None:
        self.g = g
        self.int32 = int32
        self.np_type: type[np.integer] = np.int32 if int32 else np.int64

    def indices(self, values: dict[str, str], name: str) -> dict[str, str]:
        """int64 values (graph inputs, shape scalars) in the index type, in their shapes. In int32 they
        are packed on the CPU into one vector (int64 Reshape, Concat and Cast: the EP takes none), so one
        copy crosses to the adapter a run, split there into int32 values:

            positions [b, s] ┐                            ┌► positions [b, s]
            slots [b, s]     ├► flatten, Concat, Cast ──► Split ┼► slots [b, s]       (adapter)
            ... block_size   ┘     (CPU, int64)   one copy      └► ... block_size []
        """
        if not self.int32:
            return values
        g = self.g
        names = list(values)
        flat = [g.op("Reshape", [values[n], g.const([-1])], f"{name}/{n}/flat") for n in names]
        sizes = g.op("Concat", [g.op("Shape", [f], f"{name}/{n}/size") for n, f in zip(names, flat)], f"{name}/sizes", axis=0)
        packed = g.op("Concat", flat, f"{name}/packed", axis=0)
        packed = g.op("Cast", [packed], f"{name}/packed/Cast_int32", to=TensorProto.INT32)
        parts = g.op_multi("Split", [packed, sizes], f"{name}/Split", len(names), axis=0)
        return {
            n: g.op("Reshape", [part, g.op("Shape", [values[n]], f"{name}/{n}/shape")], f"{name}/{n}")
            for n, part in zip(names, parts)
        }

    def index(self, x: str, name: str) -> str:
        """An int64 value (a graph input, a shape scalar) in the index type."""
        return self.g.op("Cast", [x], f"{name}/Cast_int32", to=TensorProto.INT32) if self.int32 else x

    def int64(self, x: str, name: str) -> str:
        """A value of the index type as int64, for an op whose indices are int64 by definition."""
        return self.g.op("Cast", [x], f"{name}/Cast_int64", to=TensorProto.INT64) if self.int32 else x

    def const(self, value: int | list[int]) -> str:
        return self.g.const(value, self.np_type)

    def remainder(self, x: str, quotient: str, divisor: str, name: str) -> str:
        """x mod divisor for x >= 0, given quotient = x // divisor: Mod, or in int32 x - quotient * divisor
        (the WebGPU EP has no int32 Mod kernel)."""
        if not self.int32:
            return self.g.op("Mod", [x, divisor], name)
        return self.g.op("Sub", [x, self.g.op("Mul", [quotient, divisor], f"{name}/Mul")], f"{name}/Sub")


def fused_rms_norm(g: Graph, x: str, weight: np.ndarray, eps: float, name: str, to: int = TensorProto.FLOAT) -> str:
    """x / sqrt(mean(x^2) + eps) * weight on float32 x as one SimplifiedLayerNormalization (computed in
    float32), the result of type `to`; `weight` the norm's effective weight."""
    w = g.const(weight.astype(np.float32), np.float32)
    y = g.op("SimplifiedLayerNormalization", [x, w], f"{name}/SimplifiedLayerNormalization", axis=-1, epsilon=eps, stash_type=1)
    return y if to == TensorProto.FLOAT else g.op("Cast", [y], f"{name}/Cast", to=to)
