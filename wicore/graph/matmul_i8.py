"""Linear layers on wicore.MatMulI8 (`--matmul-i8`): int8 weights with one scale per output channel, for the
CUDA flavour's float16 graphs (wicore/kernels/csrc/kernels.h says what the op computes).

    x f16 [..., K] ─► MatMulI8(w i8 [N, K], scales f32 [N]) ─► y f16 [..., N]
                      ≤ 16 rows: weight-only GEMV (float16 x, the codes exactly, float32 sums)
                      above: x's rows to int8 (absmax / 127, round half to even), cuBLASLt's int8 GEMM (int32 sums),
                             y = (sum * row scale) * channel scale

Why: on the 27B shape at 256 rows ONNX Runtime's MatMulNBits (CUTLASS fpA_intB, W8A16) ran ~2.3x slower than
cuBLAS in float16 (docs/PERFORMANCE.md); int8 tensor cores run twice float16's rate.

Accuracy: a weight is rounded once per channel (absmax / 127: half a step is 1/254 of the row's largest weight),
and above 16 rows each row of x once (1/254 of the row's largest entry). A row with an outlier channel (SmoothQuant's
observation on real LLMs' activations) rounds its other entries coarsely; one scale a row is what keeps the GEMM
one int32 product, so such models lose accuracy here that the weight-only path (≤ 16 rows) does not. Measured on
the real Gemma 3 270M (tools/check_matmul_i8_accuracy.py, docs/PERFORMANCE.md): a 200-token prompt's argmax is HF
float32's at 187 of 200 positions (MatMulNBits' 8-bit export: 200), 194 with every step weight-only (its GGUF's
4-bit blocks rounded again to a channel's int8 scale). A throughput option, not a lossless one.

`reference` is the op's arithmetic in NumPy, to the bit above 16 rows (tests, tools/check_matmul_i8_gpu.py).
"""

from __future__ import annotations

import numpy as np

from wicore.graph.ops import DataFile, Graph
from wicore.kernels.library import DOMAIN

GEMV_ROWS = 16  # kernels.h kMatMulI8GemvRows: up to this many rows weight-only


def can_run(rows: int, cols: int) -> bool:
    """Whether a weight [rows, cols] fits the op: K a multiple of 16 (the GEMV's 16-byte loads, cuBLASLt's int8
    leading dimensions) and N a multiple of 4 (cuBLASLt's int8 output)."""
    return cols % 16 == 0 and rows % 4 == 0 and cols > 0


def dense(weights: list[np.ndarray]) -> np.ndarray:
    """The [out, in] weights stacked by rows in float32; a part a source hands as blocks (a GGUF's, or
    RandomQuantSource's, whose floats are zeros) dequantized from them."""
    parts = []
    for w in weights:
        blocks = getattr(w, "blocks", None)  # QuantizedTensor: the blocks are the weight
        parts.append(blocks.dequantize() if blocks is not None else np.asarray(w, np.float32))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def quantize_channels(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [N, K] as int8 codes [N, K] and float32 scales [N]: scale = absmax / 127 a row, codes round(w / scale)
    (a zero row: codes 0, scale 0)."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scales = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))
    codes = np.clip(np.rint(w / safe[:, None]), -127, 127).astype(np.int8)
    return codes, scales


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f16 [M, K] as the op rounds it above GEMV_ROWS: int8 [M, K] and float32 scales [M] (kernels.h)."""
    x32 = np.asarray(x, np.float16).astype(np.float32)
    amax = np.abs(x32).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(x32 * inv[:, None]), -127, 127).astype(np.int8)
    return q, (amax / np.float32(127)).astype(np.float32)


def reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """What MatMulI8 computes for x f16 [..., K] (float16 out): above GEMV_ROWS rows the same bits (the int32 sums
    exact as float64 products), at or below them float64 sums (the op sums in float32: within its rounding)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = np.asarray(x, np.float16).reshape(-1, k)
    w64 = codes.astype(np.float64)
    if x2.shape[0] <= GEMV_ROWS:
        y = (x2.astype(np.float64) @ w64.T) * scales.astype(np.float64)
        return y.astype(np.float32).astype(np.float16).reshape(*lead, -1)
    q, row_scales = quantize_rows(x2)
    acc = (q.astype(np.float64) @ w64.T).astype(np.int64).astype(np.float32)  # exact below 2^53, then as the op rounds
    y = (acc * row_scales[:, None]) * scales[None, :]
    return y.astype(np.float16).reshape(*lead, -1)


def matmul_i8(
    g: Graph,
    x: str,
    weights: list[np.ndarray],
    name: str,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
) -> str:
    """x [..., K] float16 @ concat(weights)ᵀ on wicore.MatMulI8, the weights quantized per output channel
    (module doc); initializers `<weight_name>.i8` and `.i8_scales` (default `name`)."""
    rows, cols = sum(w.shape[0] for w in weights), weights[0].shape[1]
    made: list[np.ndarray] = []  # quantized once, and only where the graph has no such initializer yet

    def part(i: int) -> np.ndarray:
        if not made:
            made.extend(quantize_channels(dense(weights)))
        return made[i]

    prefix = weight_name or name
    w = g.weight(f"{prefix}.i8", lambda: part(0), data)
    s = g.weight(f"{prefix}.i8_scales", lambda: part(1), data)
    return g.op("MatMulI8", [x, w, s], f"{name}/MatMulI8", out=out, domain=DOMAIN, K=cols, N=rows)
