"""Block quantization: GGUF blocks transcoded bit-exactly, widening, fused weights, float fallback."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from wicore.export.gguf_file import read_gguf
from wicore.export.gguf_quant import can_transcode, transcode_gguf
from wicore.model.quant import BlockQuant, QuantizedTensor, concat_rows, quantize_symmetric

TRANSCODED = [T.Q8_0, T.Q5_0, T.Q4_0, T.Q6_K, T.Q4_K, T.Q5_K, T.Q4_1, T.Q5_1]
EXPECTED = {  # type -> (bits, block size, has offsets)
    T.Q8_0: (8, 32, False),
    T.Q5_0: (8, 32, False),
    T.Q4_0: (4, 32, False),
    T.Q6_K: (8, 16, False),
    T.Q4_K: (4, 32, True),
    T.Q5_K: (8, 32, True),
    T.Q4_1: (4, 32, True),
    T.Q5_1: (8, 32, True),
}
F16_FIELDS = {  # byte offsets of each type's float16 fields (d, dmin / m): random bytes there could be NaN
    T.Q8_0: (0,),
    T.Q5_0: (0,),
    T.Q4_0: (0,),
    T.Q6_K: (208,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q4_1: (0, 2),
    T.Q5_1: (0, 2),
}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes [rows, row_bytes] of random codes and scales (every bit pattern is a valid block)."""
    rng = np.random.default_rng(seed)
    elems, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // elems, size), dtype=np.uint8)
    for start in F16_FIELDS[qtype]:
        blocks[:, start : start + 2] = rng.uniform(-0.05, 0.05, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", TRANSCODED, ids=lambda t: t.name)
def test_transcoding_is_bit_exact_against_gguf_dequantize(qtype):
    rows, cols = 8, 512
    data = random_blocks(qtype, rows, cols)
    w = transcode_gguf(data, qtype, (rows, cols))
    assert (w.bits, w.block_size, w.offsets is not None) == EXPECTED[qtype]
    assert w.codes.min() >= -(2 ** (w.bits - 1)) and w.codes.max() < 2 ** (w.bits - 1)
    reference = gguf.quants.dequantize(data, qtype).reshape(rows, cols)
    np.testing.assert_array_equal(w.dequantize(), reference)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0], ids=lambda t: t.name)
def test_transcoding_what_gguf_quantized(qtype):
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    data = gguf.quants.quantize(x, qtype)
    w = transcode_gguf(data, qtype, x.shape)
    np.testing.assert_array_equal(w.dequantize(), gguf.quants.dequantize(data, qtype))


def test_types_without_a_lossless_encoding_are_refused():
    assert not can_transcode(T.IQ4_XS) and not can_transcode(T.F16)
    with pytest.raises(ValueError, match="IQ4_XS"):
        transcode_gguf(np.zeros((1, 136), np.uint8), T.IQ4_XS, (1, 256))


@pytest.mark.slow
def test_the_packaged_gemma_file_transcodes_bit_exactly():
    """One tensor of every quantized type in the real 270M GGUF (Q8_0, Q5_0, Q4_K, Q6_K)."""
    from wicore.export.sources import PACKAGED, packaged_gguf

    pytest.importorskip(PACKAGED["gemma3-270m"])
    first = {}
    for t in read_gguf(packaged_gguf("gemma3-270m")).tensors.values():
        if t.name != "token_embd.weight":  # 168 MB: covered by the graph tests
            first.setdefault(t.tensor_type, t)
    assert {T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K} <= set(first)
    for qtype, t in first.items():
        if qtype in (T.F32, T.F16):
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        w = transcode_gguf(t.data, qtype, shape)
        np.testing.assert_array_equal(w.dequantize(), gguf.quants.dequantize(t.data, qtype).reshape(shape), err_msg=t.name)


def test_widening_keeps_every_value():
    w = transcode_gguf(random_blocks(T.Q4_K, 4, 256), T.Q4_K, (4, 256))
    wide = w.widen(8, 16)
    assert (wide.bits, wide.block_size, wide.scales.shape) == (8, 16, (4, 16))
    np.testing.assert_array_equal(wide.dequantize(), w.dequantize())
    with pytest.raises(ValueError):
        wide.widen(4, 16)


def test_fused_rows_take_the_widest_encoding():
    """q (Q5_0, 8 bits / 32), k (Q4_K, 4 bits / 32, offsets), v (Q6_K, 8 bits / 16) -> 8 bits / 16, offsets."""
    parts = [transcode_gguf(random_blocks(t, 2, 256, seed=i), t, (2, 256)) for i, t in enumerate([T.Q5_0, T.Q4_K, T.Q6_K])]
    fused = concat_rows(parts)
    assert (fused.bits, fused.block_size, fused.shape) == (8, 16, (6, 256))
    np.testing.assert_array_equal(fused.offsets[[0, 1, 4, 5]], 0.0)
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([p.dequantize() for p in parts]))


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_quantization_error_is_half_a_step(bits):
    w = np.random.default_rng(2).standard_normal((16, 128)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block
    q = quantize_symmetric(w, bits, 32)
    step = np.repeat(q.scales, 32, axis=1)
    assert np.all(np.abs(q.dequantize() - w) <= step / 2 * (1 + 1e-6))
    np.testing.assert_array_equal(q.dequantize()[3, :32], 0.0)
    assert np.abs(q.codes).max() == 2 ** (bits - 1) - 1


def test_quantized_tensor_is_its_floats_and_views_forget_the_blocks():
    data = random_blocks(T.Q8_0, 4, 64)
    floats = gguf.quants.dequantize(data, T.Q8_0).reshape(4, 64)
    calls = []
    t = QuantizedTensor(floats, lambda: calls.append(1) or transcode_gguf(data, T.Q8_0, (4, 64)))
    np.testing.assert_array_equal(t, floats)
    assert t[:2].blocks is None and t.T.blocks is None and (t + 1).blocks is None
    assert isinstance(t.blocks, BlockQuant) and t.blocks is t.blocks and calls == [1]
