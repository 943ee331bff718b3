"""wicore.BlockAttentionQKV on the CPU (wicore/kernels/csrc/attention_qkv_cpu.cc, ops_attention.cc) against
a float64 NumPy reference of what the graph ops before BlockAttention computed: the per-head q/k norms,
rotate-half RoPE at each token's position, q times the scale, the K/V written at slot_mapping."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_cpu_attention import attention_reference, session, value

from wicore.kernels.library import DOMAIN

F32, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
NH, KVH, HD, BS, EPS = 4, 2, 16, 4, 1e-6
NAMES = ["qkv", "k", "v", "tables", "positions", "slots", "past", "cos", "sin", "q_norm", "k_norm"]
TYPES = {"tables": I64, "positions": I64, "slots": I64, "past": I32}


def qkv_session(path: str, rope: bool, norms: bool, window: int, scale: float) -> ort.InferenceSession:
    names = NAMES[:7] + (NAMES[7:9] if rope else ["", ""]) + (NAMES[9:] if norms else ["", ""])
    node = helper.make_node(
        "BlockAttentionQKV", names, ["out", "k_out", "v_out"], domain=DOMAIN, num_heads=NH, num_kv_heads=KVH,
        window=window, softcap=0.0, scale=scale, epsilon=EPS,
    )  # fmt: skip
    inputs = [value(n, TYPES.get(n, F32), None) for n in names if n]
    return session(path, [node], inputs, [value(n, F32, None) for n in ("out", "k_out", "v_out")])


def prologue_reference(x: np.ndarray, w: np.ndarray | None, cos: np.ndarray | None, sin: np.ndarray | None) -> np.ndarray:
    """[tokens, heads, hd] float64: rms(x) * w per head, then rotate-half with cos / sin [tokens, hd / 2]."""
    if w is not None:
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w
    if cos is None:
        return x
    c, s, half = cos[:, None, :], sin[:, None, :], HD // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@pytest.mark.parametrize(("rope", "norms"), [(True, True), (False, False)], ids=["norms+rope", "neither"])
@pytest.mark.parametrize("seq", [1, 3], ids=["decode", "prefill"])
def test_the_op_norms_rotates_writes_and_attends(cpu_library, rope, norms, seq):
    """Three rows of 5, 9 and 0 cached tokens take `seq` new ones each (window 6): the new K/V land at
    their slots (every other pool value untouched), the output is float64's within float32's rounding."""
    rng = np.random.default_rng(seq)
    num_blocks, scale = 12, 0.3
    past = np.array([5, 9, 0], np.int32)
    tables = np.array([[7, 2, 9], [1, 11, 4], [3, 5, 6]], np.int64)  # out of order: the tables are read
    positions = past[:, None].astype(np.int64) + np.arange(seq)
    slots = np.take_along_axis(tables, positions // BS, axis=1) * BS + positions % BS
    tokens = 3 * seq
    feeds = {
        "qkv": rng.normal(0, 1, (3, seq, (NH + 2 * KVH) * HD)).astype(np.float32),
        "k": rng.normal(0, 1, (num_blocks, BS, KVH, HD)).astype(np.float32),
        "v": rng.normal(0, 1, (num_blocks, BS, KVH, HD)).astype(np.float32),
        "tables": tables, "positions": positions, "slots": slots, "past": past,
        "cos": rng.uniform(-1, 1, (40, HD // 2)).astype(np.float32),
        "sin": rng.uniform(-1, 1, (40, HD // 2)).astype(np.float32),
        "q_norm": rng.normal(1, 0.5, HD).astype(np.float32),
        "k_norm": rng.normal(1, 0.5, HD).astype(np.float32),
    }  # fmt: skip
    s = qkv_session(cpu_library, rope, norms, window=6, scale=scale)
    out, k_out, v_out = s.run(None, {n: feeds[n] for n in {i.name for i in s.get_inputs()}})

    rows = feeds["qkv"].reshape(tokens, NH + 2 * KVH, HD).astype(np.float64)
    flat = positions.reshape(-1)
    cos, sin = (feeds["cos"][flat], feeds["sin"][flat]) if rope else (None, None)
    q = prologue_reference(rows[:, :NH], feeds["q_norm"] if norms else None, cos, sin) * scale
    k = prologue_reference(rows[:, NH : NH + KVH], feeds["k_norm"] if norms else None, cos, sin)
    k_want, v_want = feeds["k"].astype(np.float64), feeds["v"].astype(np.float64)
    k_want.reshape(-1, KVH, HD)[slots.reshape(-1)] = k
    v_want.reshape(-1, KVH, HD)[slots.reshape(-1)] = rows[:, NH + KVH :]
    written = np.zeros(num_blocks * BS, bool)
    written[slots.reshape(-1)] = True
    assert np.array_equal(k_out.reshape(-1, KVH, HD)[~written], feeds["k"].reshape(-1, KVH, HD)[~written])
    assert np.array_equal(v_out, v_want.astype(np.float32))  # v as it came
    np.testing.assert_allclose(k_out, k_want, rtol=0, atol=2e-6)
    want = attention_reference(q.reshape(3, seq, -1), k_want, v_want, tables, positions, past + seq, None, 6, 0.0)
    assert out.shape == (3, seq, NH * HD)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5)


def test_a_slot_outside_the_pool_is_refused(cpu_library):
    s = qkv_session(cpu_library, rope=False, norms=False, window=0, scale=1.0)
    feeds = {
        "qkv": np.zeros((1, 1, (NH + 2 * KVH) * HD), np.float32),
        "k": np.zeros((2, BS, KVH, HD), np.float32), "v": np.zeros((2, BS, KVH, HD), np.float32),
        "tables": np.array([[1]], np.int64), "positions": np.array([[0]], np.int64),
        "slots": np.array([[2 * BS]], np.int64), "past": np.array([0], np.int32),
    }  # fmt: skip
    with pytest.raises(
        ort.capi.onnxruntime_pybind11_state.RuntimeException,
        match="BlockAttentionQKV: slot_mapping names a slot outside the pool",
    ):
        s.run(None, feeds)
