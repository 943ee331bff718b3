"""`--attention batch-invariant` (wicore/graph/invariant_attention.py): a row's logits, bit for bit,
whatever else is in its batch, however its prompt is chunked and however many threads run.

A tiny random Gemma 3 with Gemma's head_dim of 256 (the portable attention's slicing shows at
K = 256), run through ModelGraphs on the CPU EP: prompts prefilled alone into blocks of their
own, then one decode step of all rows together against each row alone. The portable export is
the control: there a short row batched with long ones gets other logits than alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from batch_rows import Row

from wicore.devices.providers import parse_device
from wicore.executor.batch import build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

BS = 16
LENGTHS = [5, 40, 300, 37, 500]  # short rows batched with long ones: key widths 16 .. 512
SHAPE = dict(head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=1024, sliding_window=64)


@pytest.fixture(scope="module")
def exports(tiny_model, tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """attention -> (exported folder, HF model): one tiny model, exported both ways."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    folder, model = tiny_model(**SHAPE)
    out = {}
    for attention in ("portable", "batch-invariant"):
        path = tmp_path_factory.mktemp("invariant") / attention
        export_model(open_source(str(folder)), path, ExportConfig(attention=attention), progress=lambda _: None)
        out[attention] = (path, model)
    return out


def open_graphs(folder: Path, num_threads: int) -> ModelGraphs:
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")]
    return ModelGraphs(folder, manifest, KVBuffers(manifest, CacheConfig(80, BS), devices), devices, num_threads)


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(1, 512, n).tolist() for n in LENGTHS]


def blocks_of(index: int) -> list[int]:
    """Row `index`'s own blocks, room for its prompt and one more token."""
    first = 1 + sum(n // BS + 1 for n in LENGTHS[:index])
    return list(range(first, first + LENGTHS[index] // BS + 1))


def prefill(graphs: ModelGraphs, tokens: list[int], blocks: list[int], chunks: list[int]) -> np.ndarray:
    """The prompt's logits at every position, prefilled in `chunks`, each row holding only the
    blocks its chunk reaches (as the scheduler allocates them)."""
    logits, pos = [], 0
    for n in chunks:
        reach = blocks[: -(-(pos + n) // BS)]
        row = Row(tokens[pos : pos + n], pos, reach, reach, 0, n)
        logits.append(graphs.run(build_batch([row], BS)).logits)
        pos += n
    assert pos == len(tokens)
    return np.concatenate(logits)


def decode_together_and_alone(graphs: ModelGraphs) -> tuple[np.ndarray, np.ndarray]:
    rows = []
    for i, tokens in enumerate(prompts()):
        blocks = blocks_of(i)
        last = prefill(graphs, tokens, blocks, [len(tokens)])[-1]
        rows.append(Row([int(last.argmax())], len(tokens), blocks, blocks, 0, 1))
    together = graphs.run(build_batch(rows, BS)).logits  # writes each row's new K/V where alone writes it
    alone = np.concatenate([graphs.run(build_batch([row], BS)).logits for row in rows])
    return together, alone


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_a_decode_row_gets_the_same_logits_in_any_batch(exports, num_threads):
    together, alone = decode_together_and_alone(open_graphs(exports["batch-invariant"][0], num_threads))
    assert np.array_equal(together, alone)


def test_the_portable_attention_is_not_batch_invariant(exports):
    """The control: the same step on the portable export differs for the short rows (by ~1e-6
    relative: enough for int8 activations to round differently)."""
    together, alone = decode_together_and_alone(open_graphs(exports["portable"][0], 1))
    differs = [not np.array_equal(t, a) for t, a in zip(together, alone)]
    assert differs[0] and differs[1] and differs[3]
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-4)


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.slow  # 4 s on the 2-core VM, loaded
def test_prompt_logits_do_not_depend_on_the_chunking(exports, num_threads):
    graphs = open_graphs(exports["batch-invariant"][0], num_threads)
    tokens, blocks = prompts()[4], blocks_of(4)
    whole = prefill(graphs, tokens, blocks, [500])
    for chunks in ([256, 244], [3, 17, 64, 128, 288], [100] * 5):
        assert np.array_equal(prefill(graphs, tokens, blocks, chunks), whole), chunks


def test_batch_invariant_graphs_compute_hf_logits(exports, reference_logits):
    folder, model = exports["batch-invariant"]
    tokens = prompts()[2]
    ours = prefill(open_graphs(folder, 2), tokens, blocks_of(2), [128, 172])
    np.testing.assert_allclose(ours, reference_logits(model, tokens), rtol=0, atol=2e-4)


# -- the real Gemma 3 270M, ort-quant (int8 activations: the default CPU export's flavour) ----------
@pytest.mark.slow
def test_270m_greedy_requests_generate_alone_what_they_generate_together(export_cached):
    """16 greedy requests, short and long, at once and then one by one on the same engine (prefix
    cache on, so the second pass also reuses blocks the first computed in other batches). With the
    default attention 3 to 5 of such 16 differ (docs/RELIABILITY.md)."""
    from wicore.cli.verify import VERIFY_TEXT
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.types.sampling import SamplingParams

    folder = export_cached("gemma3-270m-ort-quant-invariant", "gemma3-270m", op_flavour="ort-quant", attention="batch-invariant")
    words = VERIFY_TEXT.split()
    prompts = [" ".join(words[: 3 + 5 * i]) for i in range(8)] + [" ".join(words * (1 + i))[: 300 + 250 * i] for i in range(8)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with Engine(EngineConfig(model_dir=folder, num_threads=2, host_tier_gb=0)) as engine:
        together = [c.token_ids for c in engine.generate(prompts, params)]
        alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert together == alone
