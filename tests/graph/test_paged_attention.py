"""The `paged` attention export (com.microsoft.PagedAttention): what the graphs hold and who refuses them.

ONNX Runtime implements the op on the CUDA EP only, so its numbers are checked on a GPU
(tools/bench_shapes.py --check, against HF in float32; docs/PERFORMANCE.md); here: the graph
structure, the manifest, and the clear errors of the exporter and of an EP that cannot run it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph import io
from wicore.graph.gemma3 import Gemma3Builder
from wicore.graph.manifest import Manifest
from wicore.graph.ops import DataFile, Graph
from wicore.graph.paged_attention import flash_page_size
from wicore.graph.shared_values import shared_values
from wicore.runtime.graphs import ModelGraphs
from wicore.runtime.kv_buffers import CacheConfig, KVBuffers
from wicore.runtime.kv_layout import choose_block_size, default_block_size
from wicore.runtime.providers import DeviceError, parse_device

WINDOW = 8  # the tiny model's sliding window (tests/conftest.py)


@pytest.fixture(scope="module")
def paged_export(tiny_model, tmp_path_factory):
    folder, _ = tiny_model()
    out = tmp_path_factory.mktemp("paged") / "m"
    export_model(
        open_source(str(folder)), out, ExportConfig(dtype="fp16", num_partitions=2, attention="paged"), progress=lambda _: None
    )
    return out


def test_every_layer_is_one_paged_attention_node_over_its_own_buffers(paged_export):
    manifest = Manifest.read(paged_export)
    assert manifest.attention == "paged" and manifest.dtype == "fp16"
    cfg = manifest.config
    seen = []
    for record in manifest.partitions:
        graph = onnx.load(paged_export / record.file, load_external_data=False).graph
        nodes = [n for n in graph.node if n.op_type == "PagedAttention"]
        assert all(n.domain == "com.microsoft" for n in nodes)
        for node in nodes:
            layer = int(node.name.split("layers.")[1].split("/")[0])
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert attrs == {
                "num_heads": cfg.num_heads,
                "kv_num_heads": cfg.num_kv_heads,
                "scale": 1.0,
                "local_window_size": WINDOW if cfg.is_sliding(layer) else -1,
            }
            assert node.input[3:5] == [io.key_cache(layer), io.value_cache(layer)]
            assert node.output[1:] == [io.key_cache_out(layer), io.value_cache_out(layer)]
            seen.append(layer)
        inputs = set(record.inputs)
        assert io.CUMULATIVE_SEQLENS in inputs
        assert not inputs & {io.CONTEXT_LENS, io.WINDOW_FIRST_BLOCK}
        for node in nodes:  # each layer kind reads its own group's table, past lengths and bounds
            names = (
                (io.WINDOW_PAST_SEQLENS, io.WINDOW_ATTENTION_BOUNDS)
                if "sliding" in node.input[7]
                else (io.PAST_SEQLENS, io.ATTENTION_BOUNDS)
            )
            assert (node.input[6], node.input[16]) == names
        assert not [n for n in graph.node if n.op_type in ("ScatterND", "Softmax")]  # the op does both
    assert sorted(seen) == list(range(cfg.num_layers))
    head = (io.TOP_PROBS, io.TOP_IDS, io.SAMPLED_TOKENS)  # the sampling head: on by default with the paged attention
    assert manifest.partitions[-1].outputs[-5:] == (io.LOGITS, io.GREEDY_TOKENS, *head)


def test_a_layer_is_a_handful_of_fused_kernels_in_float16(paged_export):
    """At batch 1 a decode step costs a kernel a node: a paged layer holds ONNX Runtime's fused
    kernels only, its activations float16 between the residual's norms (no Cast in a layer)."""
    record = Manifest.read(paged_export).partitions[0]
    graph = onnx.load(paged_export / record.file, load_external_data=False).graph
    layer = Counter(n.op_type for n in graph.node if n.name.startswith("/model/layers.0/"))
    assert layer == {
        "SimplifiedLayerNormalization": 6,  # 4 around the residual, q and k norms
        "MatMul": 4,
        "Split": 2,
        "RotaryEmbedding": 2,
        "PagedAttention": 1,
        "FastGelu": 1,
        "Mul": 1,
        "Add": 2,
        "Reshape": 6,  # views, no kernel
    }


def test_packed_rows_are_gemmas_norm_and_rope_at_each_tokens_position(tiny_model, tmp_path):
    """Gemma3Builder.packed_rows (q/k norm, scale, RoPE, packing for the op) run on the CPU EP
    against the rotate-half formula in float64, at the positions of two rows."""
    folder, _ = tiny_model()
    cfg = open_source(str(folder)).config
    builder = Gemma3Builder(cfg, "fp16", attention="paged")
    g = Graph("rows", DataFile(tmp_path / "rows.data"))
    shared = shared_values(g, cfg, 0, cfg.num_layers, contrib=True, paged=True, rope_type=TensorProto.FLOAT16)
    heads, hd = cfg.num_heads, cfg.head_dim
    x = g.input("x", TensorProto.FLOAT16, ["batch", "seq", heads * hd])
    rng = np.random.default_rng(0)
    weight = rng.normal(size=hd).astype(np.float32)
    for is_sliding in (True, False):
        rows = builder.packed_rows(g, x, weight, heads, shared, is_sliding, f"rows{is_sliding}", scale=0.5)
        g.output(rows, TensorProto.FLOAT16, ["tokens", heads * hd])
    session = ort.InferenceSession(g.to_model(17).SerializeToString(), providers=["CPUExecutionProvider"])
    positions = np.array([[5, 6, 7], [1000, 1001, 1002]], dtype=np.int64)
    xs = rng.normal(size=(2, 3, heads * hd)).astype(np.float16)
    feeds = {"positions": positions, "x": xs}
    for unused in session.get_inputs():  # the paging inputs: read by PagedAttention only
        dtype = np.int32 if unused.type == "tensor(int32)" else np.int64
        feeds.setdefault(unused.name, np.zeros([2 if isinstance(d, str) else d for d in unused.shape], dtype))
    rows = session.run(None, feeds)

    h = xs.astype(np.float64).reshape(2, 3, heads, hd)
    normed = h / np.sqrt((h**2).mean(-1, keepdims=True) + cfg.rms_norm_eps) * (1 + weight) * 0.5
    half = hd // 2
    for got, rope in zip(rows, (cfg.rope_local, cfg.rope_global), strict=True):
        angle = positions[..., None, None] / rope.theta ** (np.arange(half) * 2 / hd) / rope.factor
        x1, x2 = normed[..., :half], normed[..., half:]
        want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
        assert got.shape == (6, heads * hd)
        np.testing.assert_allclose(got.astype(np.float64), want.reshape(6, heads * hd), atol=4e-3)


def test_a_paged_export_gets_the_blocks_its_flash_kernels_need(paged_export, tiny_export):
    """ONNX Runtime runs the op's FlashAttention only on blocks a K/V tile never straddles."""
    assert [flash_page_size(d) for d in (64, 128, 256)] == [256, 128, 64]
    paged = Manifest.read(paged_export)
    assert default_block_size(paged) == flash_page_size(paged.config.head_dim)
    assert default_block_size(Manifest.read(tiny_export()[0])) == 16


def test_smaller_blocks_for_a_paged_export_are_taken_with_a_warning(paged_export, caplog):
    paged = Manifest.read(paged_export)
    tile = flash_page_size(paged.config.head_dim)
    assert choose_block_size(paged, None) == tile and not caplog.records
    assert choose_block_size(paged, 2 * tile) == 2 * tile and not caplog.records
    assert choose_block_size(paged, 16) == 16
    assert [r.getMessage() for r in caplog.records] == [
        f"KV blocks of 16 tokens: the paged attention runs FlashAttention on multiples of {tile} only"
    ]


def test_an_ep_without_the_op_refuses_the_export_and_names_the_portable_one(paged_export):
    manifest = Manifest.read(paged_export)
    devices = [parse_device("cpu")] * 2
    buffers = KVBuffers(manifest, CacheConfig(4, 4), devices)
    with pytest.raises(DeviceError, match="re-export with --attention portable"):
        ModelGraphs(paged_export, manifest, buffers, devices)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(attention="paged"), "needs --dtype fp16"),
        (dict(attention="paged", dtype="fp16", attention_stats=True), "no attention statistics"),
        (dict(attention="flash"), "choose one of portable, paged"),
    ],
)
def test_the_exporter_refuses_what_the_op_cannot_do(settings, message):
    with pytest.raises(WiCoreError, match=message):
        ExportConfig(**settings)


def test_cuda_graphs_are_refused_without_the_paged_attention_on_one_cuda_device(tiny_export):
    folder, _ = tiny_export()
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")]
    buffers = KVBuffers(manifest, CacheConfig(4, 4), devices)
    with pytest.raises(DeviceError, match="CUDA graphs need an export with --attention paged"):
        ModelGraphs(folder, manifest, buffers, devices, cuda_graphs=True)


def test_decode_buckets_double_up_to_the_largest_batch():
    from wicore.runtime.cuda_graphs import buckets

    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(33) == [1, 2, 4, 8, 16, 32, 64]


def test_cuda_graphs_by_default_only_where_they_can_be_captured(tiny_export):
    """EngineConfig.cuda_graphs None (serve's --cuda-graphs auto) turns them on only for a paged export on one
    CUDA device; an export on the CPU runs uncaptured instead of being refused."""
    folder, _ = tiny_export()
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")]
    buffers = KVBuffers(manifest, CacheConfig(4, 4), devices)
    assert ModelGraphs(folder, manifest, buffers, devices, cuda_graphs=None, block_size=128).cuda_graphs is False


@pytest.mark.parametrize("config_class, qkv_bias", [("LlamaConfig", False), ("Qwen2Config", True)])
def test_families_without_qk_norm_scale_in_the_op(tmp_path, config_class, qkv_bias):
    """Llama and Qwen2 in the paged graphs: no q/k norm before RoPE, the op scales by head_dim^-0.5
    (Gemma folds its scale into the q-norm: the op's 1.0), Qwen2's qkv bias added in float16.
    tools/check_families_gpu.py checks their logits against HF on a GPU."""
    import torch
    import transformers

    torch.manual_seed(0)
    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    model = getattr(transformers, config_class.replace("Config", "ForCausalLM"))(
        getattr(transformers, config_class)(num_key_value_heads=2, head_dim=16, max_position_embeddings=512, **shape)
    )
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "paged"
    export_model(open_source(str(tmp_path / "hf")), out, ExportConfig(dtype="fp16", attention="paged"), progress=lambda _: None)
    graph = onnx.load(out / Manifest.read(out).partitions[0].file, load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    scales = {
        helper.get_attribute_value(a)
        for n in graph.node
        if n.op_type == "PagedAttention"
        for a in n.attribute
        if a.name == "scale"
    }
    assert ops.count("PagedAttention") == 2 and len(scales) == 1 and scales.pop() == pytest.approx(16**-0.5)
    assert ops.count("SimplifiedLayerNormalization") == 2 * 2 + 1  # the two norms of each layer and the final one
    assert ops.count("RotaryEmbedding") == 2 * 2
    biases = [n for n in graph.node if n.name.endswith("/qkv_bias")]
    assert len(biases) == (2 if qkv_bias else 0)
    consts = {i.name: i for i in graph.initializer}
    assert all(consts[n.input[1]].data_type == TensorProto.FLOAT16 for n in biases if n.input[1] in consts)
    # ONNX Runtime's type check passes (on the CPU the load then stops at PagedAttention, a CUDA kernel)
    with pytest.raises(Exception, match="PagedAttention") as refused:
        ort.InferenceSession(str(out / Manifest.read(out).partitions[0].file), providers=["CPUExecutionProvider"])
    assert "Type Error" not in str(refused.value)
