"""Positions past 100K: a tiny random Gemma 3 with 131,072 positions and linear RoPE scaling
(factor 8 on the full-attention layers, as the 4B-27B configs), against HF transformers.

Prefilling 100K tokens through the portable graphs takes minutes on a CPU (16K tokens took
21 s on a tiny model, and the attention is quadratic), so the test starts from a KV cache that
already holds 100,003 positions: the same random keys and values in our buffers and in HF's
DynamicCache (both store keys after RoPE). Twenty new tokens then run at positions 100,003 to
100,022, and one more decodes at 100,023: their queries and keys are rotated at those positions,
their full-attention layer reads all 100K cached keys, their sliding layers only the window.
Both op flavours: portable (RoPE in standard ops) and ort-quant (ONNX Runtime's RotaryEmbedding).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from batch_rows import Row

from wicore.devices.placement import plan_placement
from wicore.engine.engine import Engine, EngineConfig
from wicore.executor.batch import build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

LONG = dict(
    max_position_embeddings=131072,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
)
PAST = 100_003  # positions already in the cache
BLOCK = 4
NEW = np.random.default_rng(1).integers(0, 512, 21).tolist()  # 20 tokens prefilled, then 1 decoded


def past_kv(num_layers: int, kv_heads: int, head_dim: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random (key, value) [PAST, kv_heads, head_dim] of every layer."""
    rng = np.random.default_rng(2)
    return [tuple(rng.standard_normal((PAST, kv_heads, head_dim), dtype=np.float32) for _ in "kv") for _ in range(num_layers)]


def hf_logits_after(model, past: list[tuple[np.ndarray, np.ndarray]], steps: list[list[int]]) -> list[np.ndarray]:
    """HF's logits of each step's tokens, run one step after the other on a cache holding `past`."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (k, v) in enumerate(past):  # [1, kv_heads, PAST, head_dim]; sliding layers keep their window
        cache.update(torch.from_numpy(k).transpose(0, 1)[None], torch.from_numpy(v).transpose(0, 1)[None], layer)
    out, start = [], PAST
    with torch.no_grad():
        for ids in steps:
            position_ids = torch.arange(start, start + len(ids))[None]
            out.append(model(torch.tensor([ids]), cache=cache, position_ids=position_ids).logits[0].numpy())
            start += len(ids)
    return out


def our_logits_after(folder: Path, past: list[tuple[np.ndarray, np.ndarray]], steps: list[list[int]]) -> list[np.ndarray]:
    """Ours: the full layers' blocks 1, 2, ... hold positions 0, 4, ...; the sliding layers keep a
    ring of 12 blocks from the first one their window reaches (block 0 is the padding sink)."""
    manifest = Manifest.read(folder)
    cfg = manifest.config
    total = PAST + sum(map(len, steps))
    full_table = list(range(1, -(-total // BLOCK) + 1))
    cache = CacheConfig(num_blocks=len(full_table) + 1, block_size=BLOCK, num_window_blocks=13)
    devices = plan_placement(folder, manifest, "cpu").devices
    graphs = ModelGraphs(folder, manifest, KVBuffers(manifest, cache, devices), devices, num_threads=1)
    window_first = (PAST - cfg.sliding_window + 1) // BLOCK  # the first block any new token's window reaches
    window_table = list(range(1, -(-total // BLOCK) - window_first + 1))
    assert len(window_table) <= 12
    for layer, (k, v) in enumerate(past):
        pools = graphs.buffers.arrays(layer)
        assert pools is not None
        first = window_first if cfg.is_sliding(layer) else 0
        for pool, values in zip(pools, (k, v)):
            flat = pool[1:].reshape(-1, cfg.num_kv_heads, cfg.head_dim)  # a view: blocks 1, 2, ... in order
            flat[: PAST - first * BLOCK] = values[first * BLOCK :]
    out, start = [], PAST
    for ids in steps:
        out.append(graphs.run(build_batch([Row(ids, start, full_table, window_table, window_first, len(ids))], BLOCK)).logits)
        start += len(ids)
    return out


@pytest.fixture(scope="module")
def quantized_export(tiny_model, tmp_path_factory):
    """(ort-quant export, HF model) of the long tiny model with weights 8 bits represent exactly, so
    that MatMulNBits with float activations (accuracy level 0) computes what HF computes."""
    import torch

    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source
    from wicore.model.quant import quantize_symmetric

    _, model = tiny_model(**LONG)
    model = copy.deepcopy(model)  # the fixture's model is shared
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(quantize_symmetric(param.numpy(), 8).dequantize()))
    folder = tmp_path_factory.mktemp("long_quant")
    model.save_pretrained(folder / "hf")
    config = ExportConfig(op_flavour="ort-quant", weight_bits=8, accuracy_level=0)
    export_model(open_source(str(folder / "hf")), folder / "model", config, progress=lambda _: None)
    return folder / "model", model


@pytest.mark.parametrize("flavour", ["portable", "ort-quant"])
@pytest.mark.slow  # 4 s on the 2-core VM, loaded
def test_logits_at_positions_past_100k_match_hf(tiny_export, quantized_export, flavour):
    """portable: RoPE from standard ops; ort-quant: com.microsoft RotaryEmbedding over per-token
    cos / sin rows."""
    folder, model = tiny_export(1, **LONG) if flavour == "portable" else quantized_export
    assert Manifest.read(folder).op_flavour == flavour
    cfg = Manifest.read(folder).config
    assert (cfg.rope_global.factor, cfg.rope_local.factor, cfg.max_position_embeddings) == (8.0, 1.0, 131072)
    past = past_kv(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    steps = [NEW[:20], NEW[20:]]
    ours, ref = our_logits_after(folder, past, steps), hf_logits_after(model, past, steps)
    assert [o.shape for o in ours] == [(20, 512), (1, 512)]
    for got, want in zip(ours, ref):  # measured: 1e-6 apart (logits up to 0.66); 0.49 with the factor ignored
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_engine_takes_the_models_whole_context(tiny_export):
    """No --max-context: a sequence may reach the model's 131,072 positions when the pool holds them."""
    folder, _ = tiny_export(1, **LONG)
    config = EngineConfig(
        folder, num_threads=1, block_size=16, num_device_blocks=8194, num_window_device_blocks=8, num_host_blocks=0
    )
    with Engine(config) as eng:
        assert (eng.max_context, eng.max_sequence_tokens) == (131072, 131072)
