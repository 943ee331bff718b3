"""`--op-flavour ort-quant --kernels wicore`: fp32 graphs whose linear layers are wicore.MatMulQ."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.graph.quant import QuantLinear
from wicore.kernels.library import DOMAIN
from wicore.model.families import FAMILIES, family
from wicore.types.sampling import SamplingParams


def op_counts(folder) -> dict[str, int]:
    manifest = Manifest.read(folder)
    counts: dict[str, int] = {}
    for node in onnx.load(folder / manifest.partitions[0].file, load_external_data=False).graph.node:
        key = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.slow  # three exports and two engines of the tiny model (~10 s on the 2-core VM)
def test_ort_quant_on_matmul_q_is_ort_int8_arithmetic(tiny_model, tmp_path, cpu_library, monkeypatch):
    """4-bit symmetric weights at accuracy_level 4: MatMulQ computes what MatMulNBits does (llama.cpp's
    int8 activations, tests/kernels/test_matmul_q.py) and BlockAttention (BlockAttentionQKV on the full layers)
    what the portable attention does (within float32 rounding; the tiny Gemma 3 has GQA, per-head q/k norms and
    sliding layers past their window), so
    the greedy tokens are the same; the graph has no MatMulNBits left and the manifest makes the engine
    load the library. The default adds the residual."""
    monkeypatch.setenv("WICORE_CACHE", str(Path(cpu_library).parents[2]))  # where the fixture built the library
    folder, _ = tiny_model()
    tokens = {}
    for kernels, level in (("wicore", 4), ("ort", 4)):
        out = tmp_path / kernels
        config = ExportConfig(op_flavour="ort-quant", weight_bits=4, accuracy_level=level, kernels=kernels)
        export_model(open_source(str(folder)), out, config, progress=lambda _: None)
        assert Manifest.read(out).kernels == kernels
        counts = op_counts(out)
        if kernels == "wicore":
            layers = Manifest.read(out).config.num_layers
            assert "com.microsoft:MatMulNBits" not in counts
            assert counts[f"{DOMAIN}:MatMulQ"] >= 4 * layers + 1  # q|k|v, o, gate|up, down a layer; the head
            assert residual_flags(out) == {0}  # accuracy_level 4: llama.cpp's int8 activations alone
            # the attention on WiCore's CPU kernel too (graph/cpu_kernels.py); the full layers with its prologue inside
            config = Manifest.read(out).config
            full = sum(not config.is_sliding(i) for i in range(layers))
            assert 0 < full < layers  # the tiny Gemma 3: both kinds
            assert counts[f"{DOMAIN}:BlockAttention"] == layers - full
            assert counts[f"{DOMAIN}:BlockAttentionQKV"] == full
            assert "Softmax" not in counts and "Transpose" not in counts
        with Engine(EngineConfig(model_dir=out, num_threads=1, host_tier_gb=0)) as engine:
            completions = engine.generate([[1, 5, 9, 13, 2, 7]], SamplingParams(max_tokens=12, ignore_eos=True))
        tokens[kernels] = completions[0].token_ids
    assert len(tokens["wicore"]) == 12 and tokens["wicore"] == tokens["ort"]
    default = tmp_path / "default"
    export_model(
        open_source(str(folder)), default, ExportConfig(op_flavour="ort-quant", kernels="wicore"), progress=lambda _: None
    )
    assert residual_flags(default) == {1}  # the default: int8 plus the residual
    # prompts (32+ rows): the layers' projections on the int8 GEMM, the head on the float one (graph/quant.py)
    precisions = {n.name: a.s.decode() for n in matmul_q_nodes(default) for a in n.attribute if a.name == "prompt_precision"}
    assert len(precisions) == len(matmul_q_nodes(default))
    assert {name for name, p in precisions.items() if p == "float"} == {"/model/lm_head/MatMulQ"}


def matmul_q_nodes(folder) -> list[onnx.NodeProto]:
    manifest = Manifest.read(folder)
    nodes = onnx.load(folder / manifest.partitions[0].file, load_external_data=False).graph.node
    return [n for n in nodes if n.op_type == "MatMulQ"]


def residual_flags(folder) -> set[int]:
    return {a.i for n in matmul_q_nodes(folder) for a in n.attribute if a.name == "residual"}


def test_int8_prompts_where_the_family_says_so():
    """The layers' prompt_precision follows the family's row (graph/quant.py: measured per family); the head's
    is float whatever it says; a QuantLinear takes only the precisions MatMulQ knows."""
    config = ExportConfig(op_flavour="ort-quant", kernels="wicore")
    assert config.quant(family("gemma3").int8_prompts).layer_prompt == "int8"  # type: ignore[union-attr]
    assert config.quant(family("llama").int8_prompts).layer_prompt == "float"  # type: ignore[union-attr]
    assert [f.name for f in FAMILIES.values() if f.int8_prompts] == ["gemma3"]
    with pytest.raises(ValueError, match="layer_prompt 'int4'"):
        QuantLinear(layer_prompt="int4")


def test_wicore_kernels_need_paged_graphs_or_ort_quant():
    with pytest.raises(WiCoreError, match="--kernels wicore needs --attention paged .* or --op-flavour ort-quant"):
        ExportConfig(kernels="wicore")
    assert ExportConfig(op_flavour="ort-quant", kernels="wicore").quant().kernels == "wicore"  # type: ignore[union-attr]
