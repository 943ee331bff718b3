"""StepInputs (wicore.executor.step_inputs): a captured decode step's inputs as views into one host
buffer, copied in one transfer and bound in place. Checked on the CPU EP, where binding an input
to a raw address works the same way as on a CUDA device."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from wicore.executor.step_inputs import StepInputs

SHAPES = {"ids": ((2, 3), np.int64), "lens": ((3,), np.int32), "temps": ((2,), np.float32)}


def _identity_session() -> ort.InferenceSession:
    types = {"ids": TensorProto.INT64, "lens": TensorProto.INT32, "temps": TensorProto.FLOAT}
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [f"{name}_out"]) for name in SHAPES],
        "echo",
        [helper.make_tensor_value_info(n, types[n], list(SHAPES[n][0])) for n in SHAPES],
        [helper.make_tensor_value_info(f"{n}_out", types[n], list(SHAPES[n][0])) for n in SHAPES],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_inputs_are_aligned_views_of_one_buffer_that_never_overlap():
    shapes = {**SHAPES, "last": ((1,), np.float32)}  # the buffer ends 4 bytes past a multiple of 8
    inputs = StepInputs(shapes, ("cpu", 0))
    spans = sorted((inputs.offsets[n], inputs.offsets[n] + inputs.views[n].nbytes) for n in shapes)
    assert all(start % StepInputs.ALIGN == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in pairwise(spans))
    assert spans[-1][1] == inputs.host.size
    assert all(np.shares_memory(inputs.views[n], inputs.host) for n in shapes)
    assert {n: (v.shape, v.dtype) for n, v in inputs.views.items()} == {n: (s, np.dtype(t)) for n, (s, t) in shapes.items()}


def test_a_step_writes_padded_inputs_and_a_bound_session_reads_them_in_place():
    inputs = StepInputs(SHAPES, ("cpu", 0))
    session = _identity_session()
    binding = session.io_binding()
    inputs.bind(binding, set(SHAPES) | {"not_an_input_here"})
    for name in SHAPES:
        binding.bind_output(f"{name}_out", "cpu")
    for step, rows in enumerate(([[7, 8]], [[1, 2, 3], [4, 5, 6]])):
        ids = np.asarray(rows, np.int64)
        inputs.put("ids", ids, -1)
        inputs.put("lens", np.asarray([step + 1], np.int32), 0)
        inputs.put("temps", np.asarray([0.5], np.float32), 1.0)
        inputs.put("not_an_input_here", np.asarray([1], np.int64), 0)  # the graphs do not take it: skipped
        inputs.sync()
        session.run_with_iobinding(binding)
        ids_out, lens_out, temps_out = (o.numpy() for o in binding.get_outputs())
        padded = np.full((2, 3), -1, np.int64)
        padded[: ids.shape[0], : ids.shape[1]] = ids
        assert ids_out.tolist() == padded.tolist()
        assert lens_out.tolist() == [step + 1, 0, 0]
        assert temps_out.tolist() == [0.5, 1.0]


def test_two_host_sides_one_written_while_the_other_waits_for_its_copy():
    """Async scheduling writes step N+1's inputs while step N's side may not be copied yet: a flip
    writes the other side, each side copies what was written into it, and a fixed input is in both."""
    inputs = StepInputs(SHAPES, ("cpu", 0))
    inputs.fix("lens", np.asarray([9, 9, 9], np.int32), 0)
    first = inputs.host
    inputs.put("ids", np.asarray([[1, 2, 3]], np.int64), 0)
    inputs.flip()
    second = inputs.host
    inputs.put("ids", np.asarray([[4, 5, 6], [7, 8, 9]], np.int64), 0)
    assert not np.shares_memory(first, second)
    (device,) = inputs.buffers.values()
    inputs.sync(first)  # step N's copy, after N+1 was written
    assert device.numpy().tobytes() == first.tobytes()
    copied = first.copy()
    inputs.sync()  # the side written now
    assert device.numpy().tobytes() == second.tobytes() != copied.tobytes()
    inputs.flip()  # back to the first side, written two writes ago
    assert inputs.host is first and inputs.views["ids"].tolist() == [[1, 2, 3], [0, 0, 0]]
    assert inputs.views["lens"].tolist() == [9, 9, 9]
    inputs.flip()
    assert inputs.views["lens"].tolist() == [9, 9, 9]


def test_separate_inputs_are_values_of_their_own_each_copied_from_its_view_and_bound_whole():
    """`separate` (WebGPU: a buffer is a handle, and its graph capture takes whole OrtValues): each input
    its own device value, `sync` copies the side's views into them, `bind` binds the values themselves."""
    inputs = StepInputs(SHAPES, ("cpu", 0), separate=True)
    assert inputs.buffers == {}
    session = _identity_session()
    binding = session.io_binding()
    inputs.bind(binding, set(SHAPES))
    for name in SHAPES:
        binding.bind_output(f"{name}_out", "cpu")
    inputs.put("ids", np.asarray([[1, 2, 3]], np.int64), 0)
    inputs.fix("lens", np.asarray([4], np.int32), 0)
    first = inputs.host
    inputs.flip()
    inputs.put("ids", np.asarray([[5], [6]], np.int64), 0)
    inputs.sync(first)  # the first side's values, not the side written since
    session.run_with_iobinding(binding)
    assert [o.numpy().tolist() for o in binding.get_outputs()[:2]] == [[[1, 2, 3], [0, 0, 0]], [4, 0, 0]]
    inputs.sync()
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0].numpy().tolist() == [[5, 0, 0], [6, 0, 0]]
    values = inputs.values[("cpu", 0)]
    assert values["lens"].numpy().tolist() == [4, 0, 0]  # the same values, updated in place
