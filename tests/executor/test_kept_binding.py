"""The CPU's kept decode binding (wicore.executor.kept_binding) against a fresh binding each step.

Two ModelGraphs over equal KV buffers run the same prompt, then greedy decode steps fed their own
tokens: one asks for the logits every step (a fresh binding, ONNX Runtime's outputs: the path
before the kept binding), the other only for the greedy tokens (the kept binding). The tokens and
every KV buffer are equal after every step, through a block table that widens (an input rebound
with a new shape) and a batch of two rows then one (a new binding). One partition and two (the
second takes the first's hidden states, rebound each step).
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_rows import Row

from wicore.devices.providers import parse_device
from wicore.executor.batch import build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

BS = 4
NUM_BLOCKS = 12


def make_graphs(folder) -> ModelGraphs:
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")] * len(manifest.partitions)
    buffers = KVBuffers(manifest, CacheConfig(NUM_BLOCKS, BS), devices)
    rng = np.random.default_rng(5)  # the same noise in both: a stray write or read shows as a difference
    for layer in range(buffers.num_layers):
        for array in buffers.arrays(layer):
            array[...] = rng.standard_normal(array.shape)
    return ModelGraphs(folder, manifest, buffers, devices, num_threads=1)


def buffers_of(graphs: ModelGraphs) -> list[np.ndarray]:
    return [array.copy() for layer in range(graphs.buffers.num_layers) for array in graphs.buffers.arrays(layer)]


@pytest.mark.parametrize("partitions", [1, 2])
def test_kept_binding_gives_the_fresh_bindings_tokens_and_kv(tiny_export, partitions):
    folder = tiny_export(partitions)[0]
    fresh, kept = make_graphs(folder), make_graphs(folder)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 512, 5).tolist(), rng.integers(3, 512, 3).tolist()]
    tables = [[3, 7, 1, 9], [5, 8, 2, 10]]  # positions 0..15 each
    rows = [Row(p, 0, t[:2]) for p, t in zip(prompts, tables)]
    tokens = fresh.run(build_batch(rows, BS)).greedy_tokens.tolist()
    assert kept.run(build_batch(rows, BS), logits=False).greedy_tokens.tolist() == tokens
    starts = [len(p) for p in prompts]
    bindings = []
    for step in range(9):  # row 0: positions 5..13, its table 2 -> 4 blocks wide; row 1 leaves after 4 steps
        live = [0, 1] if step < 4 else [0]
        rows = [Row([tokens[r]], starts[r] + step, tables[r][: (starts[r] + step) // BS + 1]) for r in live]
        full = fresh.run(build_batch(rows, BS))
        greedy = kept.run(build_batch(rows, BS), logits=False)
        assert greedy.logits is None and full.logits is not None
        assert greedy.greedy_tokens.tolist() == full.greedy_tokens.tolist()
        for a, b in zip(buffers_of(fresh), buffers_of(kept)):
            np.testing.assert_array_equal(a, b)
        tokens = dict(zip(live, full.greedy_tokens.tolist()))
        bindings.append(kept.kept.get(len(kept.sessions) - 1))
    # the binding of the two rows' steps is kept; one row asks for a new one, kept from then on
    assert [b is bindings[0] for b in bindings] == [True] * 4 + [False] * 5
    assert all(b is bindings[4] for b in bindings[4:])


def test_a_bindings_key_is_its_rows_and_its_kv_buffers(tiny_export):
    """KeptBindings.binding: the same binding while num_logits and the buffers (by identity) are as before."""
    folder = tiny_export(1)[0]
    graphs = make_graphs(folder)
    session, calls = graphs.sessions[0], []
    a, b = object(), object()
    first = graphs.kept.binding(0, session, 1, [a, b], calls.append)
    assert graphs.kept.binding(0, session, 1, [a, b], calls.append) is first
    assert len(calls) == 1  # bind_kv once
    assert graphs.kept.binding(0, session, 1, [a, object()], calls.append) is not first
    assert graphs.kept.binding(0, session, 2, [a, object()], calls.append).greedy.shape == (2,)
    assert len(calls) == 3
