"""ModelGraphs' IOBinding contract on a tiny export (two partitions), checked against HF transformers:

    - the KV buffers are written in place: after a run, KVBuffers.arrays(layer) changed at
      the slots of the batch's slot mapping and nowhere else (padding: the sink block), and
      hold HF's keys and values there;
    - a later run reads what an earlier one wrote (chunked prefill gives HF's logits);
    - logits come out row by row, each row's last num_logits positions, equal to HF's.

The buffers are filled with noise before each run, so a stray write shows, and so does a read
of a slot the attention should mask (a released window block holds NaN).
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_rows import Row

from wicore.devices.providers import parse_device
from wicore.executor.batch import BatchInputs, build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

BS = 4
NUM_BLOCKS = 12
WINDOW = 8  # the tiny model's sliding window
RNG = np.random.default_rng(3)


def prompt_row(tokens: list[int], blocks: list[int], num_logits: int, window_blocks: list[int] | None = None) -> Row:
    """A whole prompt from position 0."""
    return Row(tokens, 0, blocks, blocks if window_blocks is None else window_blocks, 0, num_logits)


@pytest.fixture(scope="module")
def tiny(tiny_export):
    return tiny_export(2)  # (exported folder, HF model)


@pytest.fixture
def graphs(tiny) -> ModelGraphs:
    folder = tiny[0]
    manifest = Manifest.read(folder)
    assert len(manifest.partitions) == 2
    devices = [parse_device("cpu")] * len(manifest.partitions)
    buffers = KVBuffers(manifest, CacheConfig(NUM_BLOCKS, BS), devices)
    graphs = ModelGraphs(folder, manifest, buffers, devices, num_threads=1)
    for layer in range(buffers.num_layers):
        for array in buffers.arrays(layer):
            array[...] = RNG.standard_normal(array.shape)  # in place: the graphs hold these buffers
    return graphs


def hf_forward(model, tokens: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=True)


def snapshot(graphs: ModelGraphs) -> list[tuple[np.ndarray, np.ndarray]]:
    buffers = graphs.buffers
    return [tuple(a.copy() for a in buffers.arrays(layer)) for layer in range(buffers.num_layers)]


def changed_slots(before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """[num_blocks, block_size] bool: slots whose key or value changed."""
    return np.any(before[0] != after[0], axis=(2, 3)) | np.any(before[1] != after[1], axis=(2, 3))


def slot_mask(slots: np.ndarray) -> np.ndarray:
    mask = np.zeros((NUM_BLOCKS, BS), bool)
    mask.reshape(-1)[np.asarray(slots).reshape(-1)] = True
    return mask


def layer_slots(graphs: ModelGraphs, batch: BatchInputs, layer: int) -> np.ndarray:
    sliding = graphs.manifest.config.is_sliding(layer)
    return batch.window_slot_mapping if sliding else batch.slot_mapping


def test_a_run_writes_hfs_keys_and_values_in_place_at_its_slots_only_and_gives_hfs_logits(graphs, tiny):
    """One 10-token prompt over blocks [3, 7, 5] (window group: [6, 2, 4]): the full layer's
    buffers change at blocks 3 and 7 and the first two slots of 5, the sliding layers' at
    6, 2 and 4[:2], nothing else; what is written there is HF's cache, and the logits at
    every position are HF's."""
    model = tiny[1]
    tokens = RNG.integers(3, 512, 10).tolist()
    batch = build_batch([prompt_row(tokens, [3, 7, 5], 10, [6, 2, 4])], BS)
    full_slots = [3 * 4 + i for i in range(4)] + [7 * 4 + i for i in range(4)] + [5 * 4, 5 * 4 + 1]
    window_slots = [6 * 4 + i for i in range(4)] + [2 * 4 + i for i in range(4)] + [4 * 4, 4 * 4 + 1]
    assert batch.slot_mapping.tolist() == [full_slots] and batch.window_slot_mapping.tolist() == [window_slots]

    before = snapshot(graphs)
    out = graphs.run(batch)
    after = snapshot(graphs)
    ref = hf_forward(model, tokens)

    np.testing.assert_allclose(out.logits, ref.logits[0].numpy(), atol=1e-5, rtol=0)
    assert out.logits.shape == (10, 512) and out.attention_mass is None
    sliding = [graphs.manifest.config.is_sliding(i) for i in range(4)]
    assert sliding == [True, True, False, True]
    for layer in range(4):
        slots = window_slots if sliding[layer] else full_slots
        assert (changed_slots(before[layer], after[layer]) == slot_mask(np.array(slots))).all(), layer
        # HF's cache holds every position of a full layer, the last window - 1 of a sliding one.
        hf_keys = ref.past_key_values.layers[layer].keys[0].transpose(0, 1).numpy()  # [positions, kv_heads, head_dim]
        hf_values = ref.past_key_values.layers[layer].values[0].transpose(0, 1).numpy()
        n = len(hf_keys)
        assert n == (WINDOW - 1 if sliding[layer] else 10)
        key, value = after[layer]
        written = np.array(slots[-n:])
        np.testing.assert_allclose(key.reshape(-1, *key.shape[2:])[written], hf_keys, atol=2e-5, rtol=0)
        np.testing.assert_allclose(value.reshape(-1, *value.shape[2:])[written], hf_values, atol=2e-5, rtol=0)


def test_padding_writes_only_to_the_sink_block_and_rows_keep_their_logits(graphs, tiny):
    """Rows of 6, 3 and 1 tokens run as one [3, 6] batch: the shorter rows' padding writes
    slot 0 of the sink block (io.SINK_BLOCK) and nothing else; every row's logits are HF's."""
    model = tiny[1]
    prompts = [RNG.integers(3, 512, n).tolist() for n in (6, 3, 1)]
    rows = [prompt_row(prompts[0], [4, 9], 2), prompt_row(prompts[1], [2], 1), prompt_row(prompts[2], [11], 1)]
    batch = build_batch(rows, BS)
    sink = io.SINK_BLOCK * BS
    assert batch.slot_mapping.tolist() == [[16, 17, 18, 19, 36, 37], [8, 9, 10, sink, sink, sink], [44] + [sink] * 5]

    before = snapshot(graphs)
    out = graphs.run(batch)
    after = snapshot(graphs)

    real = slot_mask(np.array([16, 17, 18, 19, 36, 37, 8, 9, 10, 44]))
    padding = np.zeros((NUM_BLOCKS, BS), bool)
    padding[io.SINK_BLOCK, 0] = True
    for layer in range(4):
        assert (changed_slots(before[layer], after[layer]) == real | padding).all(), layer
    expected = [hf_forward(model, p).logits[0].numpy()[-r.num_logits :] for p, r in zip(prompts, rows)]
    np.testing.assert_allclose(out.logits, np.concatenate(expected), atol=1e-5, rtol=0)


def test_logits_come_out_in_row_order_for_rows_with_different_num_logits(graphs, tiny):
    """Rows asking for 3, 0, 1 and 2 logits: 6 rows of logits, row by row, each row's last ones."""
    model = tiny[1]
    prompts = [RNG.integers(3, 512, n).tolist() for n in (7, 4, 9, 2)]
    counts = [3, 0, 1, 2]
    tables = [[1, 2], [3], [4, 5, 6], [7]]
    rows = [prompt_row(p, t, n) for p, t, n in zip(prompts, tables, counts)]
    batch = build_batch(rows, BS)
    assert batch.logits_indices.tolist() == [4, 5, 6, 2 * 9 + 8, 3 * 9 + 0, 3 * 9 + 1]
    out = graphs.run(batch)
    assert out.logits.shape == (6, 512)
    expected = [hf_forward(model, p).logits[0].numpy()[len(p) - n :] for p, n in zip(prompts, counts)]
    np.testing.assert_allclose(out.logits, np.concatenate(expected), atol=1e-5, rtol=0)
    # Another order of the same rows would not pass: the check above sees the order.
    assert not np.allclose(out.logits, np.concatenate(expected[::-1]), atol=1e-3)


def test_a_later_run_reads_the_kv_an_earlier_one_wrote(graphs, tiny):
    """A 20-token prompt in two chunks: tokens 0..11 (no logits wanted), then 12..19. The second
    chunk's queries see the full layer's blocks 0..4 and, from position 12 on, the window
    blocks from logical block (12 - 8 + 1) // 4 = 1: the window block of logical block 0 is
    released (here: filled with NaN, which would poison any logit that read it)."""
    model = tiny[1]
    tokens = RNG.integers(3, 512, 20).tolist()
    full, window = [5, 1, 8, 3, 10], [2, 7, 4, 9, 6]
    first = graphs.run(build_batch([Row(tokens[:12], 0, full[:3], window[:3], 0, 0)], BS))
    assert first.logits.shape == (0, 512)
    for layer in range(4):
        if graphs.manifest.config.is_sliding(layer):
            for array in graphs.buffers.arrays(layer):
                array[window[0]] = np.nan
    second = graphs.run(build_batch([Row(tokens[12:], 12, full, window[1:], 1, 8)], BS))
    np.testing.assert_allclose(second.logits, hf_forward(model, tokens).logits[0].numpy()[12:], atol=1e-5, rtol=0)


def test_greedy_tokens_come_back_without_the_logits(graphs):
    """With logits=False only the graph's argmax reaches the host, and it is the logits' argmax."""
    rows = [
        prompt_row(RNG.integers(3, 512, 5).tolist(), [3, 7], 2, [6, 2]),
        prompt_row(RNG.integers(3, 512, 5).tolist(), [5, 8], 1),
    ]
    batch = build_batch(rows, BS)
    full = graphs.run(batch)
    greedy_only = graphs.run(batch, logits=False)  # writes the same K/V again: same result
    assert greedy_only.logits is None and full.logits is not None
    assert full.greedy_tokens.tolist() == full.logits.argmax(-1).tolist()
    assert greedy_only.greedy_tokens.tolist() == full.greedy_tokens.tolist()
    assert len(full.greedy_tokens) == 3


def test_graphs_with_decode_graphs_are_freed_as_soon_as_they_are_dropped(tiny):
    """ModelGraphs and the DecodeGraphs it owns form no reference cycle: dropping the graphs frees
    their sessions (and with them an accelerator's memory) at once, without the garbage collector."""
    import gc
    import weakref

    folder = tiny[0]
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")] * len(manifest.partitions)
    graphs = ModelGraphs(folder, manifest, KVBuffers(manifest, CacheConfig(NUM_BLOCKS, BS), devices), devices, num_threads=1)
    graphs.enable_decode_graphs(BS, 2, 4, 3, 16)
    assert graphs.decode_graphs is not None
    session = weakref.ref(graphs.sessions[0])
    gc.collect()
    gc.disable()
    try:
        del graphs
        assert session() is None
    finally:
        gc.enable()
