"""The paged graphs with layers on WiCore's BlockAttention (`--block-attention`, graph/paged_block.py).

On the CPU the float32 build of the same graph structure (every layer on BlockAttentionQKV's CPU kernel:
the q/k norms, RoPE, the scale and the K/V write inside the op) runs on ONNX Runtime against HF float32;
the float16 export that the GPU runs is checked node by node: its sliding layers on BlockAttentionQKV,
its full layers on ONNX Runtime's PagedAttention. tools/check_families_gpu.py runs it on CUDA.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from paged_reference import PagedRunner

from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.kernels.library import DOMAIN

PROMPTS = [list(range(3, 16)), list(range(40, 45)), list(range(100, 121))]  # past the window (8) and a block (8)
DECODE_STEPS = 3


def layer_ops(folder) -> dict[int, collections.Counter[str]]:
    """Each layer's attention node types (WiCore's as domain:op)."""
    (part,) = folder.glob("part-*.onnx")
    ops: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for node in onnx.load(part, load_external_data=False).graph.node:
        if node.name.startswith("/model/layers.") and "/attn/" in node.name:
            op = f"{DOMAIN}:{node.op_type}" if node.domain == DOMAIN else node.op_type
            ops[int(node.name.split("/")[2].split(".")[1])][op] += 1
    return ops


@pytest.mark.slow
def test_float32_block_attention_graph_is_hf_on_the_cpu(tiny_model, tmp_path, cpu_library, reference_logits):
    """Three prompts prefilled alone (one past the window), then decode steps of all three rows
    batched at their own lengths: every logit within float32's noise of HF's, each token HF's argmax."""
    folder, model = tiny_model()
    config = ExportConfig(dtype="fp32", attention="paged", block_attention="all", sampling_head="off")
    export_model(open_source(str(folder)), tmp_path / "m", config, progress=lambda _: None)
    assert all(ops == {"MatMul": 2, f"{DOMAIN}:BlockAttentionQKV": 1} for ops in layer_ops(tmp_path / "m").values())
    runner = PagedRunner(tmp_path / "m", max_rows=3, max_tokens=30, library=cpu_library)
    tokens = []
    for prompt in PROMPTS:
        logits = runner.prefill(prompt)
        np.testing.assert_allclose(logits, reference_logits(model, prompt), atol=2e-5, rtol=0)
        tokens.append([int(logits[-1].argmax())])
    rows = list(range(len(PROMPTS)))
    for _ in range(DECODE_STEPS):
        step = runner.step(rows, [t[-1:] for t in tokens])[:, -1]
        for row, logits in enumerate(step):
            ref = reference_logits(model, PROMPTS[row] + tokens[row])[-1]
            np.testing.assert_allclose(logits, ref, atol=2e-5, rtol=0)
            assert int(logits.argmax()) == int(ref.argmax())
            tokens[row].append(int(logits.argmax()))


@pytest.mark.slow
def test_float16_sliding_layers_on_block_attention_are_the_paged_export(tiny_model, tmp_path):
    """The float16 graphs with and without BlockAttention on the sliding layers, run by onnx.reference
    (NumPy ops, tests/paged_reference.py): prompt and decode logits within float16's rounding of each
    other, the same greedy tokens. (ONNX Runtime's ops here; WiCore's residual kernels have no NumPy twin.)"""
    folder, _ = tiny_model(head_dim=64, query_pre_attn_scalar=64)
    runners = []
    for mode in ("sliding", "off"):
        config = ExportConfig(dtype="fp16", attention="paged", block_attention=mode, sampling_head="off")
        export_model(open_source(str(folder)), tmp_path / mode, config, progress=lambda _: None)
        runners.append(PagedRunner(tmp_path / mode, max_rows=3, max_tokens=30))
    tokens: list[list[int]] = [[], []]
    for prompt in PROMPTS:
        new, old = (runner.prefill(prompt) for runner in runners)
        np.testing.assert_allclose(new, old, atol=5e-3, rtol=0)
        for got, logits in zip(tokens, (new, old), strict=True):
            got.append(int(logits[-1].argmax()))
    assert tokens[0] == tokens[1]
    for _ in range(DECODE_STEPS):
        new, old = (runner.step([0, 1, 2], [[t] for t in tokens[0][-3:]])[:, -1] for runner in runners)
        np.testing.assert_allclose(new, old, atol=5e-3, rtol=0)
        assert new.argmax(-1).tolist() == old.argmax(-1).tolist()
        tokens[0] += new.argmax(-1).tolist()


def test_the_float16_export_puts_sliding_layers_on_block_attention(tiny_model, tmp_path):
    """--block-attention sliding: the sliding layers (0, 1, 3) on one BlockAttentionQKV node each (the q/k
    norms, RoPE and the K/V write inside, the pools written in place), the full layer (2) on ORT's
    PagedAttention; auto the same with WiCore's kernels (paged_block.AUTO_KINDS: the sliding layers; Gemma 3's
    per-head norms fuse into the op), PagedAttention everywhere with ORT's ops."""
    folder, _ = tiny_model(head_dim=64, query_pre_attn_scalar=64)  # a head dim of the CUDA kernel
    for name, kernels, mode in (("sliding", "wicore", "sliding"), ("auto", "wicore", "auto"), ("ort", "ort", "auto")):
        config = ExportConfig(dtype="fp16", attention="paged", kernels=kernels, block_attention=mode)
        export_model(open_source(str(folder)), tmp_path / name, config, progress=lambda _: None)
    assert layer_ops(tmp_path / "auto") == layer_ops(tmp_path / "sliding")
    assert [ops[f"{DOMAIN}:BlockAttentionQKV"] for ops in layer_ops(tmp_path / "auto").values()] == [1, 1, 0, 1]
    (part,) = (tmp_path / "sliding").glob("part-*.onnx")
    nodes = {n.name: n for n in onnx.load(part, load_external_data=False).graph.node}
    for i, ops in layer_ops(tmp_path / "sliding").items():
        if i == 2:
            assert ops["PagedAttention"] == 1 and f"{DOMAIN}:BlockAttentionQKV" not in ops
            continue
        assert ops == {"MatMul": 2, f"{DOMAIN}:BlockAttentionQKV": 1}  # qkv_proj, o_proj
        node = nodes[f"/model/layers.{i}/attn/BlockAttentionQKV"]
        assert list(node.input[1:7]) == [
            f"key_cache.{i}", f"value_cache.{i}", "window_logical_tables", "positions", "window_slot_mapping", "past_seqlens",
        ]  # fmt: skip
        assert list(node.output[1:]) == [f"key_cache_out.{i}", f"value_cache_out.{i}"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {
            "num_heads": 4,
            "num_kv_heads": 2,
            "window": 8,
            "softcap": 0.0,
            "scale": 1.0,
            "epsilon": pytest.approx(1e-6),
        }
    assert all(
        ops["PagedAttention"] == 1 and not ops[f"{DOMAIN}:BlockAttentionQKV"] for ops in layer_ops(tmp_path / "ort").values()
    )


def test_a_head_dim_the_cuda_kernel_lacks_keeps_orts_op(tiny_model, tmp_path):
    """head_dim 32 (the tiny model's): the float16 graphs keep PagedAttention on every layer."""
    folder, _ = tiny_model()
    config = ExportConfig(dtype="fp16", attention="paged", kernels="wicore", block_attention="sliding")
    export_model(open_source(str(folder)), tmp_path / "m", config, progress=lambda _: None)
    assert all(ops["PagedAttention"] == 1 for ops in layer_ops(tmp_path / "m").values())


@pytest.mark.parametrize(
    ("config", "resolved"),
    [
        (dict(), "off"),  # the portable graphs
        (dict(dtype="fp16", attention="paged"), "off"),  # ORT's ops only: no library of WiCore's to load
        (dict(dtype="fp16", attention="paged", kernels="wicore"), "fused"),  # the CUDA paged export on WiCore's kernels
        (dict(dtype="fp16", attention="paged", kernels="wicore", block_attention="off"), "off"),
        (dict(dtype="fp16", attention="paged", kernels="wicore", block_attention="all"), "all"),
        (dict(dtype="fp16", attention="paged", block_attention="sliding"), "sliding"),
        (dict(op_flavour="ort-quant", weight_bits=8, kernels="wicore"), "off"),  # the CPU's MatMulQ graphs
    ],
)
def test_auto_block_attention_is_on_for_the_paged_export_on_wicore_kernels(config, resolved):
    assert ExportConfig(**config).resolved_block_attention() == resolved


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(block_attention="some"), "--block-attention 'some': choose auto, off, sliding, all"),
        (dict(block_attention="sliding"), "--block-attention needs --attention paged"),
        (dict(attention="paged", block_attention="sliding"), "--attention paged needs --dtype fp16"),
        (dict(attention="paged", block_attention="all", kernels="wicore"), "fp32 only with --block-attention all --kernels ort"),
    ],
)
def test_bad_block_attention_settings_are_refused(config, message):
    with pytest.raises(WiCoreError, match=message):
        ExportConfig(**config)
