"""The `webgpu` op flavour (wicore/graph/fused_ops.py) on the CPU EP: the fused norms, RoPE and GELU and the
int32 index arithmetic decode what the portable graphs decode. (On the WebGPU EP: test_webgpu.py.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from wicore.devices.graph_nodes import graph_nodes, load_graph
from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.sampling import SamplingParams

TINY_IDS = [2, 17, 301, 44, 9, 250, 3, 77, 128, 5]
PROMPT = "The history of the printing press begins in the fifteenth century, when"
# int64 nodes the flavour keeps (fused_ops.py): the inputs packed and cast to int32, shapes and their
# scalars, and the casts back to int64 for ScatterND's and RotaryEmbedding's indices
INT64_OPS = {"Cast", "Shape", "Gather", "Mul", "Unsqueeze", "Concat", "ReduceProd", "Reshape"}


def encode(folder: Path, text: str) -> list[int]:
    """The export's own tokenizer on `text`, read from its folder (no engine: a 270M engine's start
    takes seconds)."""
    return Tokenizer(folder, TokenizerInfo.from_dict(Manifest.read(folder).tokenizer)).encode(text)


def greedy(folder: Path, ids: list[int], num_tokens: int) -> list[int]:
    config = EngineConfig(model_dir=folder, num_threads=2, host_tier_gb=0, enable_prefix_cache=False)
    with Engine(config) as engine:
        (result,) = engine.generate([ids], SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    assert result.error is None
    return result.token_ids


@pytest.fixture(scope="module")
def tiny_flavours(tiny_model, tmp_path_factory) -> tuple[dict[str, Path], object]:
    """The tiny Gemma 3 exported in both flavours, and its HF model."""
    folder, model = tiny_model()
    out = tmp_path_factory.mktemp("flavours")
    exports = {}
    for flavour in ("portable", "webgpu"):
        exports[flavour] = out / flavour
        export_model(open_source(str(folder)), exports[flavour], ExportConfig(op_flavour=flavour), progress=lambda _: None)
    return exports, model


def test_the_norms_are_fused_and_the_index_arithmetic_is_int32(tiny_flavours):
    exports, _ = tiny_flavours
    nodes = graph_nodes(load_graph(exports["webgpu"] / "part-00.onnx"))
    ops = Counter(n.op_type for n in nodes)
    # 4 layers: 2 skip norms each (the first layer's input norm plain), 2 post-norms and 2 q/k norms
    # each, the final norm
    assert ops["SkipSimplifiedLayerNormalization"] == 7
    assert ops["SimplifiedLayerNormalization"] == 1 + 4 * 4 + 1
    assert ops["RotaryEmbedding"] == 8 and ops["FastGelu"] == 4
    assert not {"Pow", "ReduceMean", "Sqrt", "Tanh", "Mod"} & set(ops)
    assert {n.op_type for n in nodes if n.dtype == "int64"} <= INT64_OPS


def test_the_tiny_model_decodes_hf_tokens_in_both_flavours(tiny_flavours, reference_greedy):
    exports, model = tiny_flavours
    expected = reference_greedy(model, TINY_IDS, 12)
    assert greedy(exports["webgpu"], TINY_IDS, 12) == greedy(exports["portable"], TINY_IDS, 12) == expected


def test_the_webgpu_flavours_paged_graphs_run_every_layer_on_the_eps_paged_attention():
    """The webgpu flavours' paged graphs are ONNX Runtime's op on every layer (test_webgpu.py runs them):
    WiCore's own kernels (BlockAttention, fused norms) are refused by name."""
    ExportConfig(dtype="fp16", op_flavour="webgpu-quant", attention="paged")
    with pytest.raises(WiCoreError, match="drop --kernels wicore and --block-attention"):
        ExportConfig(dtype="fp16", op_flavour="webgpu", attention="paged", block_attention="sliding")
    with pytest.raises(WiCoreError, match="drop --kernels wicore and --block-attention"):
        ExportConfig(dtype="fp16", op_flavour="webgpu-quant", attention="paged", kernels="wicore")
    with pytest.raises(WiCoreError, match="WebGPU kernels: drop --kernels wicore"):
        ExportConfig(op_flavour="webgpu-quant", kernels="wicore")


@pytest.mark.slow
def test_gemma_270m_writes_the_portable_exports_tokens(export_cached, gemma_270m):
    folder = export_cached("gemma3-270m-webgpu", "gemma3-270m", op_flavour="webgpu")
    ids = encode(folder, PROMPT)
    assert greedy(folder, ids, 16) == greedy(gemma_270m(1), ids, 16)


@pytest.mark.slow
def test_smollm2_writes_the_portable_exports_tokens(smollm2):
    folder = smollm2("webgpu")
    ids = encode(folder, PROMPT)
    assert greedy(folder, ids, 16) == greedy(smollm2(), ids, 16)


@pytest.mark.slow
def test_an_image_prompt_gives_hf_logits(tiny_multimodal, tmp_path):
    """Image spans (attend_until, packed with the other paging inputs) in the webgpu flavour."""
    from multimodal import png, user
    from tiny_engine import tiny_config

    from wicore.engine.scheduler import SchedulerConfig
    from wicore.inputs.image_loader import load_image

    folder = tmp_path / "webgpu"
    export_model(open_source(str(tiny_multimodal.folder)), folder, ExportConfig(op_flavour="webgpu"), progress=lambda _: None)
    images = [png(0), png(1)]
    messages = user("Compare", images[0], "and", images[1], "which one is brighter?")
    inputs = tiny_multimodal.inputs(messages, images)
    with Engine(tiny_config(folder, scheduler=SchedulerConfig(prefill_chunk=7))) as engine:
        ids = inputs["input_ids"][0].tolist()
        loaded = [load_image(b, engine.vision.config.preprocessing) for b in images]
        (done,) = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True), images=[loaded])
    assert done.error is None
    reference = tiny_multimodal.logits(inputs)
    assert done.prompt_logits.shape == reference.shape
    assert np.abs(done.prompt_logits - reference).max() <= 1e-4
