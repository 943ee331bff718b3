"""The runtime's micro-graphs: valid ONNX at the model graphs' IR version, and each computes what
its docstring says on the CPU EP."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from wicore.devices.micrographs import copy_graph, gather_graph, pool_name, put_graph, take_graph, zeros_graph

BLOCK = (2, 3)
F32 = TensorProto.FLOAT


def run(model: onnx.ModelProto, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, inputs)))


@pytest.mark.parametrize(
    "model",
    [
        zeros_graph(np.dtype(np.float16), 3),
        gather_graph(4, F32, BLOCK),
        put_graph(4, F32, BLOCK),
        take_graph(F32, BLOCK),
        copy_graph(F32, BLOCK),
    ],
    ids=["zeros", "gather", "put", "take", "copy"],
)
def test_each_graph_is_valid_onnx_at_ir_version_10(model):
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10 and model.opset_import[0].version == 17


def test_gather_stacks_the_frames_blocks_of_every_pool_and_put_splits_them_back():
    rng = np.random.default_rng(0)
    pools = {pool_name(j): rng.standard_normal((5, *BLOCK)).astype(np.float32) for j in range(4)}
    frames = np.array([4, 0, 2], np.int64)
    blocks = run(gather_graph(4, F32, BLOCK), frames=frames, **pools)["blocks"]
    assert blocks.shape == (3, 4, *BLOCK)
    assert all(np.array_equal(blocks[:, j], pools[pool_name(j)][frames]) for j in range(4))
    back = run(put_graph(4, F32, BLOCK), blocks=blocks)
    assert sorted(back) == [f"{pool_name(j)}_out" for j in sorted(range(4), key=pool_name)]
    assert all(np.array_equal(back[f"{pool_name(j)}_out"], blocks[:, j]) for j in range(4))
    assert [pool_name(j) for j in range(3)] == ["key_cache.0", "value_cache.0", "key_cache.1"]


def test_take_gathers_key_and_value_frames_copy_passes_them_and_zeros_fills_a_shape():
    k, v = np.arange(30, dtype=np.float32).reshape(5, *BLOCK), -np.arange(30, dtype=np.float32).reshape(5, *BLOCK)
    taken = run(take_graph(F32, BLOCK), frames=np.array([3, 3, 1], np.int64), k=k, v=v)
    assert np.array_equal(taken["k_out"], k[[3, 3, 1]]) and np.array_equal(taken["v_out"], v[[3, 3, 1]])
    copied = run(copy_graph(F32, BLOCK), k=k, v=v)
    assert np.array_equal(copied["k_out"], k) and np.array_equal(copied["v_out"], v)
    zeros = run(zeros_graph(np.dtype(np.float16), 2), shape=np.array([2, 7], np.int64))["zeros"]
    assert zeros.dtype == np.float16 and zeros.shape == (2, 7) and not zeros.any()
