"""wicore.MatMulQ's int8 prompt GEMM (wicore/kernels/csrc/matmul_q_int8.cc, a node's prompt_precision "int8"):
against float64 from the same int8 rounding of x, and against the float prompt path it stands in for; which
path a node takes (its attribute, WICORE_MATMULQ_PROMPT over it, neither: float)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_matmul_q import fma32, has_vnni, quantize_rows, random_weight, session
from wicore.graph.matmul_q import attributes, pack

U = 2.0**-24


def int8_session(path: str, w, residual: bool = True):
    return session(path, w, residual=residual, prompt_precision="int8")


def int8_value(x: np.ndarray, w) -> tuple[np.ndarray, np.ndarray]:
    """Σ_b s d Σ (code + zp) q + Σ_b (o - zp s) d Σ q in float64 from the kernel's float32 inputs
    (o - zp s one fma in float32), and Σ of the terms' magnitudes."""
    q, d, sums = quantize_rows(x, w.block_size)
    zp = 8 if w.bits == 4 else 128
    unsigned = w.codes.astype(np.int64) + zp
    m, k = x.shape
    n, nb = w.shape[0], k // w.block_size
    off = w.offsets if w.offsets is not None else np.zeros((n, nb), np.float32)
    o2 = fma32(np.full_like(w.scales, -zp), w.scales, off).astype(np.float64)
    p = np.einsum("mbj,nbj->mnb", q.reshape(m, nb, w.block_size), unsigned.reshape(n, nb, w.block_size)).astype(np.float64)
    d_w = np.repeat(d, 32 // w.block_size, axis=1)  # d a weight block
    t1 = p * w.scales.astype(np.float64)[None] * d_w.astype(np.float64)[:, None, :]
    t2 = o2[None] * sums.astype(np.float64)[:, None, :]
    return (t1 + t2).sum(-1), (np.abs(t1) + np.abs(t2)).sum(-1)


@pytest.mark.parametrize(
    ("bits", "block_size", "offsets"),
    [(4, 32, False), (4, 32, True), (8, 32, False), (8, 32, True), (8, 16, False), (4, 16, True)],
    ids=["Q4_0", "Q4_1-Q4_K", "Q8_0", "Q5_K", "Q6_K", "4bit-16"],
)
@pytest.mark.parametrize(("m", "n", "k"), [(32, 203, 96), (37, 40, 160)])
def test_int8_prompt_is_its_value_within_float32_rounding(cpu_library, bits, block_size, offsets, m, n, k):
    """Each block's product rounds s * d once, the fma chain over 2 K / block_size terms once a term:
    |error| <= (2 K / bs + 2) u Σ |terms|. Tiles of 4 rows (a ragged last one), panels of 32 weight rows
    (a part one), several tasks of 64."""
    if not has_vnni(cpu_library):
        pytest.skip("the int8 prompt path runs on AVX-512 VNNI CPUs only")
    rng = np.random.default_rng(m * 1000 + n + k + bits + block_size)
    w = random_weight(rng, n, k, bits, block_size, offsets)
    x = rng.standard_t(3, (1, m, k)).astype(np.float32)
    (y,) = int8_session(cpu_library, w).run(None, {"x": x})
    want, size = int8_value(x[0], w)
    bound = (2 * k // block_size + 2) * U * size
    assert np.all(np.abs(y[0] - want) <= bound)
    (y_float,) = session(cpu_library, w, residual=True).run(None, {"x": x})
    assert not np.array_equal(y[0], y_float[0])  # without the attribute: the float path


def test_int8_prompt_leaves_short_inputs_to_the_int8_rows(cpu_library):
    """Below 32 rows the attribute changes nothing: decode steps keep the residual rows' bits."""
    rng = np.random.default_rng(3)
    w = random_weight(rng, 40, 96, 4, 32, True)
    x = rng.standard_t(3, (1, 5, 96)).astype(np.float32)
    (y,) = int8_session(cpu_library, w).run(None, {"x": x})
    (want,) = session(cpu_library, w, residual=True).run(None, {"x": x})
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize(
    ("attribute", "env", "path"),
    [
        (None, None, "float"),  # a graph exported before the attribute: the float GEMM, as then
        ("float", None, "float"),
        ("int8", None, "int8"),
        ("int8", "float", "float"),  # the variable overrides every node (experiments)
        ("float", "int8", "int8"),
        (None, "int8", "int8"),
    ],
)
def test_prompt_precision_picks_the_path(cpu_library, monkeypatch, attribute, env, path):
    """The node's prompt_precision, or WICORE_MATMULQ_PROMPT over it, picks the GEMM of a 32-row step: the
    same bits as that path's reference node (float: no attribute, no variable; int8: the attribute)."""
    if not has_vnni(cpu_library):
        pytest.skip("the int8 prompt path runs on AVX-512 VNNI CPUs only")
    rng = np.random.default_rng(5)
    w = random_weight(rng, 70, 128, 4, 32, True)
    x = rng.standard_t(3, (1, 32, 128)).astype(np.float32)
    monkeypatch.delenv("WICORE_MATMULQ_PROMPT", raising=False)
    want = {
        "float": session(cpu_library, w, residual=True).run(None, {"x": x})[0],
        "int8": int8_session(cpu_library, w).run(None, {"x": x})[0],
    }
    assert not np.array_equal(want["float"], want["int8"])
    if env is not None:
        monkeypatch.setenv("WICORE_MATMULQ_PROMPT", env)  # read when the kernel is made
    (y,) = session(cpu_library, w, residual=True, prompt_precision=attribute).run(None, {"x": x})
    np.testing.assert_array_equal(y, want[path])


@pytest.mark.parametrize(("shape", "path"), [((1, 32), "int8"), ((2, 40), "int8"), ((35, 1), "float"), ((2, 16), "float")])
def test_int8_prompts_only_where_a_row_holds_32_tokens(cpu_library, monkeypatch, shape, path):
    """x [rows, seq, K]: the int8 GEMM where seq >= 32 (a prompt chunk), the float one for 32+ rows of fewer
    tokens each (a decode step of 35 streams, short prompts batched): the same bits as the float path's node."""
    if not has_vnni(cpu_library):
        pytest.skip("the int8 prompt path runs on AVX-512 VNNI CPUs only")
    monkeypatch.delenv("WICORE_MATMULQ_PROMPT", raising=False)
    rng = np.random.default_rng(6)
    w = random_weight(rng, 70, 128, 8, 32, True)
    x = rng.standard_t(3, (*shape, 128)).astype(np.float32)
    (y,) = int8_session(cpu_library, w).run(None, {"x": x})
    flat = x.reshape(1, -1, 128)  # the same rows as one prompt of 32+ tokens: the int8 GEMM
    want = {
        "int8": int8_session(cpu_library, w).run(None, {"x": flat})[0].reshape(y.shape),
        "float": session(cpu_library, w, residual=True).run(None, {"x": x})[0],
    }
    assert not np.array_equal(want["int8"], want["float"])
    np.testing.assert_array_equal(y, want[path])


def test_prompt_precision_says_what_it_takes(cpu_library, monkeypatch):
    w = random_weight(np.random.default_rng(0), 8, 64, 4, 32, False)
    monkeypatch.setenv("WICORE_MATMULQ_PROMPT", "int4")
    with pytest.raises(Exception, match="must be int8 or float, not int4"):
        session(cpu_library, w, prompt_precision="int8")
    with pytest.raises(ValueError, match="prompt_precision 'int4': expected one of"):
        attributes(pack(w), w, True, "int4")  # the exporter's side
