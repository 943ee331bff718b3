"""wicore.MatMulQ (wicore/kernels/csrc/matmul_q_cpu.cc) against a NumPy model of the same arithmetic
(bit for bit, VNNI, AVX2 and scalar paths alike, one row and tiles of rows) and against the float32
matmul of the dequantized weight."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.graph.matmul_q import BLOCK, attributes, inputs, pack
from wicore.kernels.library import DOMAIN
from wicore.model.quant import BlockQuant

LANES = 8  # 4 columns a lane (matmul_q_cpu.cc)
RESIDUAL = 128  # the residual's steps: d / 128


def quantize_rows(x: np.ndarray, block_size: int, residual: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [M, K] -> q int [M, K], d float32 [M, K / 32], sums float32 [M, K / block_size] (d * Σ q a weight
    block). With the residual, q is 128 q1 + q2 (q2 the first rounding's error in steps of d / 128) and d is d / 128."""
    m, k = x.shape
    blocks = x.reshape(m, k // BLOCK, BLOCK)
    d = np.abs(blocks).max(-1) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    r = np.rint(blocks * inv[..., None])
    q = r.astype(np.int64)
    if residual:  # fma(-r, d, x): r * d is exact in float64, one rounding to float32 (as the kernel's fma)
        left = (blocks.astype(np.float64) - r.astype(np.float64) * d[..., None].astype(np.float64)).astype(np.float32)
        q2 = np.clip(np.rint(left * (inv * np.float32(RESIDUAL))[..., None]), -127, 127).astype(np.int64)
        q, d = RESIDUAL * q + q2, d / np.float32(RESIDUAL)
    q = q.reshape(m, k)
    per = BLOCK // block_size
    sums = np.repeat(d, per, axis=1) * q.reshape(m, k // block_size, block_size).sum(-1).astype(np.float32)
    return q, d, sums.astype(np.float32)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma: the product is exact in float64 (<= 48 bits here), one rounding to float32."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def lane_sum(acc: np.ndarray) -> np.ndarray:
    """The kernel's fixed order of summing 8 lanes."""
    return ((acc[..., 0] + acc[..., 4]) + (acc[..., 2] + acc[..., 6])) + (
        (acc[..., 1] + acc[..., 5]) + (acc[..., 3] + acc[..., 7])
    )


def reference(x: np.ndarray, w: BlockQuant, residual: bool = False) -> np.ndarray:
    """The kernel's arithmetic: per 32 columns 8 lanes of exact 4-column integer dot products, each
    scaled by s * d and fma-accumulated in float32; the lanes summed in a fixed order; plus the offsets'
    term, fma-accumulated over the blocks."""
    m, k = x.shape
    n = w.shape[0]
    q, d, sums = quantize_rows(x, w.block_size, residual)
    codes = w.codes.astype(np.int64)
    acc = np.zeros((m, n, LANES), np.float32)
    lane_block = np.arange(LANES) * (BLOCK // w.block_size) // LANES  # weight block of each lane in its 32
    for b in range(k // BLOCK):
        cols = slice(b * BLOCK, (b + 1) * BLOCK)
        p = np.einsum("mlj,nlj->mnl", q[:, cols].reshape(m, LANES, 4), codes[:, cols].reshape(n, LANES, 4))
        scale = w.scales[:, b * BLOCK // w.block_size + lane_block][None] * d[:, b][:, None, None]  # [m, n, lanes]
        acc = fma32(p.astype(np.float32), scale.astype(np.float32), acc)
    y = lane_sum(acc)
    if w.offsets is None:
        return y
    off = np.zeros((m, n), np.float32)  # the offsets' term: fma over the weight blocks in order
    for b in range(k // w.block_size):
        off = fma32(np.broadcast_to(w.offsets[None, :, b], (m, n)), np.broadcast_to(sums[:, b, None], (m, n)), off)
    return (y + off).astype(np.float32)


def random_weight(rng: np.random.Generator, n: int, k: int, bits: int, block_size: int, offsets: bool) -> BlockQuant:
    half = 2 ** (bits - 1)
    codes = rng.integers(-half, half, (n, k)).astype(np.int8)
    scales = rng.uniform(1e-3, 2e-2, (n, k // block_size)).astype(np.float32)
    off = rng.normal(0, 0.05, (n, k // block_size)).astype(np.float32) if offsets else None
    return BlockQuant(codes, scales, off, bits, block_size)


# MatMulQ's code paths, forced through WICORE_MATMULQ_PATH ("fast": the best this CPU runs; each falls
# back to a slower one where the CPU lacks it, and all must give the same bits)
PATHS = ["fast", "avx2", "scalar"]


def session(
    path: str,
    w: BlockQuant,
    force: str = "fast",
    residual: bool = False,
    threads: int = 2,
    narrow_widths: bool = False,
    narrow_8bit_scales: bool = False,
    prompt_precision: str | None = None,
    narrow_codes: bool = True,
) -> ort.InferenceSession:
    """One MatMulQ node on w: by default its 4- / 8-bit codes and float32 scales (the reference layouts),
    with `narrow_widths` the export's (5 / 6 bits, float16 scales where exact: graph/matmul_q.py; with
    `narrow_codes` False 8-bit codes and narrow scales, a head in the cache's form);
    `prompt_precision` None: no such attribute (a graph exported before it)."""
    packed = pack(w, narrow_widths, narrow_8bit_scales, narrow_codes)
    names, inits = ["x"], []
    for entry in inputs(packed):
        names.append("" if entry is None else entry[0])
        if entry is not None:
            role, a = entry
            inits.append(helper.make_tensor(role, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape), a.tobytes(), raw=True))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulQ", names, ["y"], domain=DOMAIN, **attributes(packed, w, residual, prompt_precision))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "t", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    opts.intra_op_num_threads = threads
    saved = os.environ.pop("WICORE_MATMULQ_PATH", None)
    if force != "fast":
        os.environ["WICORE_MATMULQ_PATH"] = force  # read when the kernel is made, at the session's start
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    finally:
        os.environ.pop("WICORE_MATMULQ_PATH", None)
        if saved is not None:
            os.environ["WICORE_MATMULQ_PATH"] = saved


@pytest.mark.parametrize(
    ("bits", "block_size", "offsets"),
    [(4, 32, False), (4, 32, True), (8, 32, False), (8, 32, True), (8, 16, False), (4, 16, True)],
    ids=["Q4_0", "Q4_1-Q4_K", "Q8_0", "Q5_K", "Q6_K", "4bit-16"],
)
@pytest.mark.parametrize("force", PATHS)
@pytest.mark.parametrize("residual", [False, True], ids=["int8", "residual"])
def test_matmul_q_is_its_arithmetic_bit_for_bit(cpu_library, bits, block_size, offsets, force, residual):
    rng = np.random.default_rng(bits * 100 + block_size + offsets)
    n, k = 203, 192  # rows over several tasks of 64, a ragged last one and a part group of 8
    w = random_weight(rng, n, k, bits, block_size, offsets)
    x = rng.normal(0, 1, (2, 3, k)).astype(np.float32)
    x[0, 1, :BLOCK] = 0  # an all-zero block: scale 0, no division
    (y,) = session(cpu_library, w, force, residual).run(None, {"x": x})
    assert y.shape == (2, 3, n) and y.dtype == np.float32
    np.testing.assert_array_equal(y.reshape(6, n), reference(x.reshape(6, k), w, residual))


@pytest.mark.parametrize(
    ("bits", "block_size", "offsets"),
    [(4, 32, True), (8, 32, True), (8, 16, False), (4, 16, False)],
    ids=["Q4_1-Q4_K", "Q5_K", "Q6_K", "4bit-16"],
)
@pytest.mark.parametrize("force", PATHS)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 32), (4, 7, 64), (7, 13, 96), (11, 70, 32)])
def test_matmul_q_tiles_rows_and_columns_bit_for_bit(cpu_library, bits, block_size, offsets, force, m, n, k):
    """Prompts: rows in tiles (3 a tile, a ragged last one), weight rows in tiles of 4 (8 bits: a part tile
    at the end; 4 bits: inside the padded groups of 8), several tasks of 64 weight rows; with the residual."""
    rng = np.random.default_rng(m * 1000 + n + k + bits)
    w = random_weight(rng, n, k, bits, block_size, offsets)
    x = rng.standard_t(3, (1, m, k)).astype(np.float32)  # heavy tails, as hidden states have
    (y,) = session(cpu_library, w, force, residual=True).run(None, {"x": x})
    np.testing.assert_array_equal(y[0], reference(x[0], w, residual=True))


@pytest.mark.parametrize("residual", [False, True], ids=["int8", "residual"])
@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_q_is_the_float_matmul_within_int8_rounding(cpu_library, bits, residual):
    """Against x @ dequantize(w)ᵀ in float64: the only error is x's rounding (at most half a step a
    column: d / 2, or d / 256 with the residual), so |error| <= Σ_c |w[n, c]| step(c) / 2."""
    rng = np.random.default_rng(bits)
    n, k = 64, 576
    w = random_weight(rng, n, k, bits, 32, offsets=True)
    x = rng.normal(0, 1, (4, k)).astype(np.float32)
    (y,) = session(cpu_library, w, residual=residual).run(None, {"x": x[None]})
    y = y[0]
    dense = w.dequantize().astype(np.float64)
    want = x.astype(np.float64) @ dense.T
    _, step, _ = quantize_rows(x, 32, residual)
    bound = np.abs(dense) @ np.repeat(step, BLOCK, axis=1).T.astype(np.float64) / 2 + 1e-4
    assert np.all(np.abs(y - want) <= bound.T)
    assert np.abs(y - want).max() < (0.001 if residual else 0.05) * np.abs(want).max()  # and small against the outputs


@pytest.mark.parametrize(
    ("bits", "block_size", "offsets"),
    [(4, 32, False), (4, 32, True), (8, 32, False), (8, 32, True), (8, 16, False), (4, 16, True)],
    ids=["Q4_0", "Q4_1-Q4_K", "Q8_0", "Q5_K", "Q6_K", "4bit-16"],
)
@pytest.mark.parametrize(("m", "n", "k"), [(32, 203, 96), (37, 40, 160), (70, 21, 64)])
@pytest.mark.parametrize("force", ["fast", "avx2"])
def test_matmul_q_prompt_is_the_float_matmul_within_fma_rounding(cpu_library, bits, block_size, offsets, m, n, k, force):
    """From 32 rows on an AVX-512 or AVX2 CPU (matmul_q_float.cc): x in float32 against the weight dequantized
    as fma(s, code, o) in float32, one fma chain over k an output: against float64,
    |error| <= K u Σ_k |x_k w_k| / (1 - K u). Tiles of 8 rows (AVX2: 6; a ragged last one), panels of 32
    weight rows (AVX2: 16; a part one, of 5 columns at N 21), several tasks of 64, and 70 rows: two chunks of
    activation rows (64, AVX2: 60). The portable path keeps the int8 arithmetic."""
    if not float_prompts(cpu_library):
        pytest.skip("the float prompt path runs on AVX-512 and AVX2 CPUs only")
    rng = np.random.default_rng(m * 1000 + n + k + bits + block_size)
    w = random_weight(rng, n, k, bits, block_size, offsets)
    x = rng.standard_t(3, (1, m, k)).astype(np.float32)
    (y,) = session(cpu_library, w, force, residual=True).run(None, {"x": x})
    scales = np.repeat(w.scales, block_size, axis=1).astype(np.float64)
    off = np.repeat(w.offsets, block_size, axis=1).astype(np.float64) if offsets else 0.0
    dense = (scales * w.codes.astype(np.float64) + off).astype(np.float32).astype(np.float64)  # one rounding: the fma
    want = x[0].astype(np.float64) @ dense.T
    u = 2.0**-24
    bound = k * u / (1 - k * u) * (np.abs(x[0]).astype(np.float64) @ np.abs(dense).T)
    assert np.all(np.abs(y[0] - want) <= bound)
    assert not np.array_equal(y[0], reference(x[0], w, residual=True))  # not the int8 arithmetic
    (forced,) = session(cpu_library, w, "scalar", residual=True).run(None, {"x": x})  # the portable path stays int8
    np.testing.assert_array_equal(forced[0], reference(x[0], w, residual=True))


@pytest.mark.parametrize("force", PATHS)
def test_matmul_q_rows_kept_between_calls_bit_for_bit(cpu_library, force):
    """The quantized rows live in a thread's buffers from one call to the next (ops.cc): sessions with other
    K, M, widths and residual settings run in turn on one thread, each against the reference every time."""
    rng = np.random.default_rng(7)
    cases = [(4, 32, True, True, 192), (8, 16, False, False, 96), (4, 32, False, False, 320), (8, 32, True, True, 64)]
    runs = []
    for bits, block_size, offsets, residual, k in cases:
        w = random_weight(rng, 40, k, bits, block_size, offsets)
        runs.append((session(cpu_library, w, force, residual, threads=1), w, residual, k))
    for m in (1, 3, 1, 2):
        for s, w, residual, k in runs:
            x = rng.standard_t(3, (1, m, k)).astype(np.float32)
            (y,) = s.run(None, {"x": x})
            np.testing.assert_array_equal(y[0], reference(x[0], w, residual))


@pytest.mark.parametrize("kind", ["Q6_K", "Q8_0", "Q4_K"])
def test_decode_row_gives_the_same_bits_on_any_number_of_threads(cpu_library, kind):
    """A decode row over a wide N, in the tiny GGUFs' head's form (8-bit codes, narrow scales, the residual),
    on 1 to 4 of ONNX Runtime's threads (ops.cc: tasks of 64 weight rows, each thread's share a contiguous
    range taken from its end by the others as they finish): the reference's bits every time."""
    rng = np.random.default_rng(len(kind))
    w = gguf_like(rng, kind, 64 * 37 + 13, 256)  # 37 whole tasks and a ragged one (AVX2 rows: 8 + 4 + 1 a pass)
    x = rng.standard_t(3, (1, 1, 256)).astype(np.float32)
    want = reference(x[0], w, residual=True)
    for threads in (1, 2, 3, 4):
        s = session(
            cpu_library, w, residual=True, threads=threads, narrow_widths=True, narrow_8bit_scales=True, narrow_codes=False
        )
        for _ in range(3):
            np.testing.assert_array_equal(s.run(None, {"x": x})[0][0], want)


def has_vnni(path: str) -> bool:
    """Whether MatMulQ's fast paths run on this CPU (ops.cc's WicoreHasVnni)."""
    return bool(ctypes.CDLL(path).WicoreHasVnni())


def float_prompts(path: str) -> bool:
    """Whether MatMulQ's steps of 32+ rows take the float GEMM on this CPU (AVX-512 or AVX2: ops.cc's
    WicoreFloatPrompts)."""
    return bool(ctypes.CDLL(path).WicoreFloatPrompts())


def test_matmul_q_says_what_it_takes(cpu_library):
    w = random_weight(np.random.default_rng(0), 4, 64, 4, 32, False)
    s = session(cpu_library, w)
    with pytest.raises(Exception, match="K must be a multiple of 32"):
        s.run(None, {"x": np.zeros((1, 1, 48), np.float32)})


# -- the GGUF's own widths: 5- / 6-bit codes, float16 and super-block scales (graph/matmul_q_scales.py) ----------
def halves(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float, signed: bool = False) -> np.ndarray:
    """Random float16 values as float32 (a GGUF's d, dmin, m)."""
    v = rng.uniform(low, high, shape) * (rng.choice([-1, 1], shape) if signed else 1)
    return v.astype(np.float16).astype(np.float32)


def gguf_like(rng: np.random.Generator, kind: str, n: int, k: int) -> BlockQuant:
    """A weight as wicore/export/gguf_quant.py transcodes each GGUF type: the scales and offsets the GGUF's
    float16 fields give in float32 (K-quants: a float16 each 256 columns times a 6-bit or int8 sub-scale)."""
    supers = k // 256
    if kind in ("Q8_0", "Q5_0", "Q4_0", "Q4_1"):
        bits, low, high = {"Q8_0": (8, -128, 128), "Q5_0": (8, -16, 16), "Q4_0": (4, -8, 8), "Q4_1": (4, -8, 8)}[kind]
        d = halves(rng, (n, k // 32), 1e-3, 2e-2)
        m = halves(rng, (n, k // 32), 0.0, 0.2, signed=True)
        offsets = (np.float32(8) * d + m).astype(np.float32) if kind == "Q4_1" else None  # fields_d_m(8)
        return BlockQuant(rng.integers(low, high, (n, k)).astype(np.int8), d, offsets, bits, 32)
    if kind == "Q6_K":  # d * int8 sc, blocks of 16; d negative as llama.cpp's quantizer makes it
        d = np.repeat(halves(rng, (n, supers), 1e-4, 1e-3, signed=True), 16, axis=1)
        sc = rng.integers(-128, 128, (n, k // 16)).astype(np.float32)
        return BlockQuant(rng.integers(-32, 32, (n, k)).astype(np.int8), (d * sc).astype(np.float32), None, 8, 16)
    d = np.repeat(halves(rng, (n, supers), 1e-4, 1e-3), 8, axis=1)  # Q4_K, Q5_K: d sc - dmin m
    dmin = np.repeat(halves(rng, (n, supers), 1e-4, 1e-3), 8, axis=1)
    scale = d * rng.integers(0, 64, (n, k // 32)).astype(np.float32)
    minimum = dmin * rng.integers(0, 64, (n, k // 32)).astype(np.float32)
    if kind == "Q4_K":  # codes q - 8, offset 8 scale - min (fields_k(8))
        return BlockQuant(
            rng.integers(-8, 8, (n, k)).astype(np.int8), scale, (np.float32(8) * scale - minimum).astype(np.float32), 4, 32
        )
    return BlockQuant(
        rng.integers(0, 32, (n, k)).astype(np.int8), scale, (np.float32(0) * scale - minimum).astype(np.float32), 8, 32
    )


# what pack() must choose for each: code bits, and whether scales / offsets are super-block ints ("ints"),
# per-block float16 ("half") or float32
NARROWED = {
    "Q8_0": (8, "float32", None),  # 8-bit codes keep MatMulNBits' float32 scales
    "Q8_0-f16": (8, "half", None),  # ... unless asked (pack's narrow_8bit_scales): the kernel takes them
    "Q5_0": (5, "half", None),
    "Q4_1": (4, "half", "half"),
    "Q6_K": (6, "ints", None),
    "Q4_K": (4, "ints", "ints"),
    "Q5_K": (5, "ints", "ints"),
}


def form(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return "float32"
    return "half" if value.ints is None else "ints"  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", list(NARROWED))
def test_pack_narrows_each_gguf_type_exactly(kind):
    """pack() keeps the GGUF's widths (the codes unpacked by kernels.h's layout, independently of
    pack_codes; every scale and offset's float32 bits from its narrow form)."""
    rng = np.random.default_rng(len(kind))
    gguf_type, f16 = kind.removesuffix("-f16"), kind.endswith("-f16")
    w = gguf_like(rng, gguf_type, 24, 512)
    packed = pack(w, narrow_8bit_scales=f16)
    bits, scales, offsets = NARROWED[kind]
    assert (packed.bits, form(packed.scales), form(packed.offsets)) == (bits, scales, offsets)
    if bits in (5, 6):
        raw = packed.codes.reshape(24, 512 // 32, -1).astype(np.int64)
        col = np.arange(32)
        low = np.where(col < 16, raw[:, :, col % 16] & 0x0F, raw[:, :, col % 16] >> 4)
        h, nbytes = bits - 4, 4 * (bits - 4)
        high = (raw[:, :, 16 + col % nbytes] >> (h * (col // nbytes))) & ((1 << h) - 1)
        np.testing.assert_array_equal((low + (high << 4)).reshape(24, 512) - packed.zero_point, w.codes)
    wide = pack(w, narrow_widths=False)
    for narrow_value, wide_value in ((packed.scales, wide.scales), (packed.offsets, wide.offsets)):
        if narrow_value is None or isinstance(narrow_value, np.ndarray):
            continue
        # (4 bits: both in the grouped layout, [N / 8, blocks, 8], the super-blocks along axis 1 as well)
        is_offset = narrow_value is packed.offsets and packed.offset_scale != 0
        base = np.float32(packed.offset_scale) * wide.scales if is_offset else None
        np.testing.assert_array_equal(narrow_value.values(base).view(np.uint32), np.asarray(wide_value).view(np.uint32))


@pytest.mark.parametrize("kind", list(NARROWED))
@pytest.mark.parametrize("force", PATHS)
@pytest.mark.parametrize("m", [1, 5, 17, 33], ids=["decode", "tiles", "tiles-17", "prompt"])
def test_narrow_widths_give_the_wide_bits(cpu_library, kind, force, m):
    """Every path, decode (the VNNI rows unpack 5 / 6 bits in registers and read narrow scales in place),
    small prompts (tiles) and long ones (the float GEMM): the narrow forms give the wide forms' output bit for
    bit, with and without the residual; several tasks of 64 weight rows and a ragged last one."""
    rng = np.random.default_rng(m + len(kind))
    k = 512 if kind.endswith("_K") else 352  # K-quants: whole super-blocks; else 11 blocks, 3 past the last 4
    gguf_type, f16 = kind.removesuffix("-f16"), kind.endswith("-f16")
    w = gguf_like(rng, gguf_type, 75, k)
    x = rng.standard_t(3, (1, m, k)).astype(np.float32)
    for residual in (False, True):
        (want,) = session(cpu_library, w, force, residual).run(None, {"x": x})
        (got,) = session(cpu_library, w, force, residual, narrow_widths=True, narrow_8bit_scales=f16).run(None, {"x": x})
        np.testing.assert_array_equal(got, want)
    if m < 32 or force == "scalar":  # 32+ rows: the float GEMM, off the int8 arithmetic
        np.testing.assert_array_equal(got[0], reference(x[0], w, residual=True))
