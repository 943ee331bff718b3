"""wicore.BlockAttention and wicore.GatedActivation (wicore/kernels/csrc/attention_cpu.cc) against
float64 NumPy references of the portable graphs' arithmetic (graph/attention.py, graph/shared_values.py)."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.kernels.library import DOMAIN

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
SCALAR = "WICORE_ATTENTION_SCALAR"
AVX2 = "WICORE_ATTENTION_AVX2"  # AVX2 without the AVX-512 prefill


def session(path: str, nodes: list, inputs: list, outputs: list, scalar: bool | str = False) -> ort.InferenceSession:
    """`scalar`: BlockAttention's scalar path (read when the kernel is made), or "avx2": AVX2 without its
    AVX-512 prefill, else the fastest the CPU has."""
    graph = helper.make_graph(nodes, "t", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    opts.intra_op_num_threads = 2  # the tasks split over threads
    env = AVX2 if scalar == "avx2" else SCALAR
    saved = os.environ.pop(env, None)
    if scalar:
        os.environ[env] = "1"
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    finally:
        os.environ.pop(env, None)
        if saved is not None:
            os.environ[env] = saved


def value(name: str, elem: int, shape: list | None) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def attention_reference(q, k_pool, v_pool, tables, positions, lens, first, window, softcap):
    """The portable graph's attention in float64: the row's blocks gathered in table order, keys at
    (first + i) * block_size + offset, visible when causal, in the context and in the window."""
    b, s = positions.shape
    _, bs, kvh, hd = k_pool.shape
    nh = q.shape[-1] // hd
    groups = nh // kvh
    q = q.reshape(b, s, nh, hd).astype(np.float64)
    out = np.zeros((b, s, nh, hd))
    for r in range(b):
        k = k_pool[tables[r]].reshape(-1, kvh, hd).astype(np.float64)  # [total, kvh, hd]
        v = v_pool[tables[r]].reshape(-1, kvh, hd).astype(np.float64)
        keys = np.arange(k.shape[0]) + (0 if first is None else first[r] * bs)
        for t in range(s):
            p = positions[r, t]
            visible = (keys <= p) & (keys < lens[r])
            if window:
                visible &= keys > p - window
            if not visible.any():
                continue
            for h in range(nh):
                scores = k[visible, h // groups] @ q[r, t, h]
                if softcap:
                    scores = softcap * np.tanh(scores / softcap)
                probs = np.exp(scores - scores.max())
                out[r, t, h] = probs / probs.sum() @ v[visible, h // groups]
    return out.reshape(b, s, nh * hd)


def attention_session(
    path: str, sliding: bool, num_heads: int, num_kv_heads: int, window: int, softcap: float, scalar: bool | str = False
) -> ort.InferenceSession:
    names = ["q", "k", "v", "tables", "positions", "lens"] + (["first"] if sliding else [])
    node = helper.make_node(
        "BlockAttention", names, ["out"], domain=DOMAIN, num_heads=num_heads, num_kv_heads=num_kv_heads,
        window=window, softcap=softcap,
    )  # fmt: skip
    types = {"q": F32, "k": F32, "v": F32}
    inputs = [value(n, types.get(n, I64), None) for n in names]
    return session(path, [node], inputs, [value("out", F32, None)], scalar)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "sliding", "window", "softcap"),
    [(4, 2, False, 0, 0.0), (3, 1, False, 0, 0.0), (4, 2, True, 5, 0.0), (2, 2, False, 6, 50.0), (6, 3, True, 7, 20.0)],
    ids=["gqa", "mqa", "sliding", "window-softcap", "sliding-softcap"],
)
@pytest.mark.parametrize("scalar", [False, "avx2", True], ids=["fastest", "avx2", "scalar"])
@pytest.mark.parametrize("seq", [1, 3], ids=["decode", "chunk"])
def test_block_attention_is_the_portable_attention(cpu_library, num_heads, num_kv_heads, sliding, window, softcap, scalar, seq):
    """Decode rows and a prefill chunk together; rows of different lengths, tables in shuffled
    pool order, unused table entries (masked by the context), a sliding row whose table starts past 0.
    float32 against float64: within 2e-5. head_dim 24: the AVX2 path's 16-column steps and an 8-column tail."""
    rng = np.random.default_rng(num_heads * 10 + window)
    hd, bs, num_blocks, max_blocks = 24, 4, 12, 3
    b, s = 3, 3
    k_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    v_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    tables = rng.permutation(num_blocks)[: b * max_blocks].reshape(b, max_blocks).astype(np.int64)
    first = np.array([0, 1, 2], np.int64) if sliding else None
    offset = 0 if first is None else first * bs
    # row 0: a prefill chunk at 7..9; row 1: decode at its last position; row 2: one key only (and padding)
    positions = np.array([[7, 8, 9], [9, 9, 9], [offset[2] if sliding else 0] * 3], np.int64)
    if sliding:
        positions[:2] += offset[:2, None]
    lens = positions.max(1) + 1
    positions = np.ascontiguousarray(positions[:, s - seq :])  # decode: each row's last token
    q = (rng.normal(0, 1, (b, seq, num_heads * hd)) * 0.5).astype(np.float32)
    feeds = {"q": q, "k": k_pool, "v": v_pool, "tables": tables, "positions": positions, "lens": lens}
    if sliding:
        feeds["first"] = first
    (out,) = attention_session(cpu_library, sliding, num_heads, num_kv_heads, window, softcap, scalar).run(None, feeds)
    want = attention_reference(q, k_pool, v_pool, tables, positions, lens, first, window, softcap)
    assert out.shape == (b, seq, num_heads * hd) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("scalar", [False, "avx2", True], ids=["fastest", "avx2", "scalar"])
def test_block_attention_prefill_over_several_chunks(cpu_library, scalar):
    """A 40-token prompt (chunks of 16 tokens, up to 48 keys: the 32-key vectors and an 8-key tail),
    sliding window 20, GQA, after 8 cached tokens."""
    rng = np.random.default_rng(7)
    hd, bs, num_blocks, max_blocks, num_heads, num_kv_heads = 32, 4, 20, 12, 4, 2
    k_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    v_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    tables = rng.permutation(num_blocks)[:max_blocks][None].astype(np.int64)
    positions = np.arange(8, 48, dtype=np.int64)[None]
    lens = np.array([48], np.int64)
    q = (rng.normal(0, 1, (1, 40, num_heads * hd)) * 0.3).astype(np.float32)
    feeds = {"q": q, "k": k_pool, "v": v_pool, "tables": tables, "positions": positions, "lens": lens}
    (out,) = attention_session(cpu_library, False, num_heads, num_kv_heads, 20, 0.0, scalar).run(None, feeds)
    want = attention_reference(q, k_pool, v_pool, tables, positions, lens, None, 20, 0.0)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_block_attention_sees_no_key_as_zeros_and_refuses_a_block_outside_the_pool(cpu_library):
    s = attention_session(cpu_library, False, 2, 1, 0, 0.0)
    pool = np.ones((2, 4, 1, 8), np.float32)
    feeds = {
        "q": np.ones((1, 1, 16), np.float32),
        "k": pool,
        "v": pool,
        "tables": np.array([[1]], np.int64),
        "positions": np.array([[3]], np.int64),
        "lens": np.array([0], np.int64),  # nothing in the context
    }
    (out,) = s.run(None, feeds)
    np.testing.assert_array_equal(out, np.zeros((1, 1, 16), np.float32))
    with pytest.raises(Exception, match="a block table names a block outside the pool"):
        s.run(None, {**feeds, "tables": np.array([[2]], np.int64)})


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_activation_float32(cpu_library, activation):
    node = helper.make_node("GatedActivation", ["x"], ["y"], domain=DOMAIN, activation=activation)
    s = session(cpu_library, [node], [value("x", F32, None)], [value("y", F32, None)])
    x = np.random.default_rng(1).normal(0, 3, (2, 3, 2 * 37)).astype(np.float32)
    (y,) = s.run(None, {"x": x})
    g, u = x[..., :37].astype(np.float64), x[..., 37:].astype(np.float64)
    if activation == "silu":
        act = g / (1 + np.exp(-g))
    else:
        act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    assert y.shape == (2, 3, 37) and y.dtype == np.float32
    np.testing.assert_allclose(y, act * u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scalar", [False, "avx2", True], ids=["fastest", "avx2", "scalar"])
@pytest.mark.parametrize(("num_heads", "window"), [(4, 0), (6, 20), (1, 0)], ids=["gqa", "window", "one-head"])
def test_block_attention_prefill_bits_do_not_depend_on_the_chunk(cpu_library, scalar, num_heads, window):
    """The same 40-token prompt run whole, then without its first token: every chunk and token pair
    boundary moves by one, and each later token's output keeps its bits (the AVX2 path scores two
    tokens' query heads together and sums a token's heads' values together; each output lane is one
    fma chain in a fixed order all the same). 6 heads on 2 KV heads: a group of 3, a pair of 6 queries;
    head_dim 40: AVX-512's 32-column step and a tail of 8."""
    rng = np.random.default_rng(num_heads + window)
    hd, bs, num_blocks, max_blocks, num_kv_heads = 40, 4, 20, 12, min(num_heads, 2)
    k_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    v_pool = rng.normal(0, 1, (num_blocks, bs, num_kv_heads, hd)).astype(np.float32)
    tables = rng.permutation(num_blocks)[:max_blocks][None].astype(np.int64)
    q = (rng.normal(0, 1, (1, 40, num_heads * hd)) * 0.3).astype(np.float32)
    lens = np.array([48], np.int64)
    attention = attention_session(cpu_library, False, num_heads, num_kv_heads, window, 0.0, scalar)
    common = {"k": k_pool, "v": v_pool, "tables": tables, "lens": lens}
    (whole,) = attention.run(None, {"q": q, "positions": np.arange(8, 48, dtype=np.int64)[None], **common})
    (later,) = attention.run(None, {"q": q[:, 1:].copy(), "positions": np.arange(9, 48, dtype=np.int64)[None], **common})
    assert later.shape == (1, 39, num_heads * hd)
    np.testing.assert_array_equal(later, whole[:, 1:])
    if scalar is False:  # AVX-512's 16 lanes a vector (where the CPU has them): AVX2's bits
        ymm = attention_session(cpu_library, False, num_heads, num_kv_heads, window, 0.0, "avx2")
        (avx2,) = ymm.run(None, {"q": q, "positions": np.arange(8, 48, dtype=np.int64)[None], **common})
        np.testing.assert_array_equal(whole, avx2)
    want = attention_reference(q, k_pool, v_pool, tables, np.arange(8, 48)[None], lens, None, window, 0.0)
    np.testing.assert_allclose(whole, want, rtol=2e-5, atol=2e-5)
