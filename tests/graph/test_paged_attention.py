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

from wicore.devices.providers import DeviceError, parse_device
from wicore.errors import WiCoreError
from wicore.executor.graphs import ModelGraphs
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.graph.paged_attention import flash_page_size
from wicore.kv.buffers import CacheConfig, KVBuffers
from wicore.kv.layout import choose_block_size, default_block_size

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
        initializers = {t.name: t for t in graph.initializer}
        nodes = [n for n in graph.node if n.op_type == "PagedAttention"]
        assert all(n.domain == "com.microsoft" for n in nodes)
        for node in nodes:
            layer = int(node.name.split("layers.")[1].split("/")[0])
            kind = "sliding" if cfg.is_sliding(layer) else "global"
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert attrs == {
                "num_heads": cfg.num_heads,
                "kv_num_heads": cfg.num_kv_heads,
                "scale": 1.0,  # Gemma's scale is in the q-norm weight
                "local_window_size": WINDOW if cfg.is_sliding(layer) else -1,
                "do_rotary": 1,
                "qk_norm_epsilon": pytest.approx(cfg.rms_norm_eps),
            }
            # q, k and v packed as the projection gives them; the op norms and rotates q and k
            assert node.input[0].endswith("/qkv_packed/output_0") and node.input[1:3] == ["", ""]
            assert node.input[3:5] == [io.key_cache(layer), io.value_cache(layer)]
            assert node.input[8:10] == [f"/model/paged/{kind}/rope.cos_cache", f"/model/paged/{kind}/rope.sin_cache"]
            assert [initializers[name].dims for name in node.input[12:14]] == [[cfg.head_dim]] * 2
            # every layer counts positions from the sequence's start: the same past lengths and bounds
            assert (node.input[6], node.input[16]) == (io.PAST_SEQLENS, io.ATTENTION_BOUNDS)
            assert node.input[7] == f"/model/paged/{kind}/tables/output_0"
            assert node.output[1:] == [io.key_cache_out(layer), io.value_cache_out(layer)]
            seen.append(layer)
        inputs = set(record.inputs)
        assert io.CUMULATIVE_SEQLENS in inputs
        assert (io.WINDOW_LOGICAL_TABLES in inputs) == any(cfg.is_sliding(i) for i in range(record.start, record.stop))
        old = {io.WINDOW_BLOCK_TABLES, io.WINDOW_PAST_SEQLENS, io.WINDOW_ATTENTION_BOUNDS}  # counted from the window
        assert not inputs & {io.CONTEXT_LENS, io.WINDOW_FIRST_BLOCK, *old}
        assert not [n for n in graph.node if n.op_type in ("ScatterND", "Softmax", "RotaryEmbedding")]  # the op does them
    assert sorted(seen) == list(range(cfg.num_layers))
    # the sampling head, on by default with the paged attention, is its own graph (graph/sampling.py)
    assert manifest.partitions[-1].outputs[-2:] == (io.LOGITS, io.GREEDY_TOKENS) and manifest.sampling_head


def test_a_layer_is_a_handful_of_fused_kernels_in_float16(paged_export):
    """At batch 1 a decode step costs a kernel a node: a paged layer holds ONNX Runtime's fused
    kernels only, its activations float16 between the residual's norms (no Cast in a layer)."""
    record = Manifest.read(paged_export).partitions[0]
    graph = onnx.load(paged_export / record.file, load_external_data=False).graph
    layer = Counter(n.op_type for n in graph.node if n.name.startswith("/model/layers.0/"))
    assert layer == {
        "SimplifiedLayerNormalization": 4,  # around the residual; the q and k norms are in the op
        "MatMul": 4,
        "Split": 1,  # gate | up
        "PagedAttention": 1,
        "FastGelu": 1,
        "Mul": 1,
        "Add": 2,
        "Reshape": 2,  # views, no kernel
    }


def test_the_op_gets_gemmas_q_k_norm_weights_and_rope_caches(paged_export, tiny_model):
    """The q-norm weight is (1 + w) * query_pre_attn_scalar^-0.5, the k-norm's (1 + w); the RoPE
    caches hold cos / sin of position * inv_freq for every position of the context, the sliding
    layers' at their own theta (checked in float64 up to the last position)."""
    _, hf = tiny_model()
    manifest = Manifest.read(paged_export)
    cfg = manifest.config
    models = [onnx.load(paged_export / record.file) for record in manifest.partitions]
    values = {t.name: onnx.numpy_helper.to_array(t) for t in models[0].graph.initializer}  # /const/i: per graph
    node = next(n for n in models[0].graph.node if n.op_type == "PagedAttention" and n.name.startswith("/model/layers.0/"))
    attn = hf.model.layers[0].self_attn
    scale = cfg.query_pre_attn_scalar**-0.5
    np.testing.assert_allclose(values[node.input[12]], (1 + attn.q_norm.weight.detach().numpy()) * scale, rtol=1e-3)
    np.testing.assert_allclose(values[node.input[13]], 1 + attn.k_norm.weight.detach().numpy(), rtol=1e-3)
    half = cfg.head_dim // 2
    positions = np.array([0, 1, 7, cfg.max_position_embeddings // 2, cfg.max_position_embeddings - 1])
    values = {t.name: onnx.numpy_helper.to_array(t) for m in models for t in m.graph.initializer if "rope" in t.name}
    for kind, rope in (("sliding", cfg.rope_local), ("global", cfg.rope_global)):
        cos, sin = (values[f"/model/paged/{kind}/rope.{name}_cache"] for name in ("cos", "sin"))
        assert cos.shape == sin.shape == (cfg.max_position_embeddings, half) and cos.dtype == np.float16
        angle = positions[:, None] / rope.theta ** (np.arange(half) * 2 / cfg.head_dim) / rope.factor
        np.testing.assert_allclose(cos[positions].astype(np.float64), np.cos(angle), atol=2e-3)
        np.testing.assert_allclose(sin[positions].astype(np.float64), np.sin(angle), atol=2e-3)


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
    with pytest.raises(DeviceError, match=r"captured decode steps \(--cuda-graphs on\) need an export with --attention paged"):
        ModelGraphs(folder, manifest, buffers, devices, cuda_graphs=True)


def test_decode_buckets_double_up_to_the_largest_batch():
    from wicore.executor.cuda_graphs import buckets

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
    assert ops.count("RotaryEmbedding") == 0  # the op rotates q and k itself
    biases = [n for n in graph.node if n.name.endswith("/qkv_bias")]
    assert len(biases) == (2 if qkv_bias else 0)
    consts = {i.name: i for i in graph.initializer}
    assert all(consts[n.input[1]].data_type == TensorProto.FLOAT16 for n in biases if n.input[1] in consts)
    # ONNX Runtime's type check passes (on the CPU the load then stops at PagedAttention, a CUDA kernel)
    with pytest.raises(Exception, match="PagedAttention") as refused:
        ort.InferenceSession(str(out / Manifest.read(out).partitions[0].file), providers=["CPUExecutionProvider"])
    assert "Type Error" not in str(refused.value)
