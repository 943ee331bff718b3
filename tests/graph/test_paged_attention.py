"""The `paged` attention export (com.microsoft.PagedAttention): what the graphs hold and who refuses them.

ONNX Runtime implements the op on the CUDA EP only, so its numbers are checked on a GPU
(tools/bench_shapes.py --check, against HF in float32; docs/PERFORMANCE.md); here: the graph
structure, the manifest, and the clear errors of the exporter and of an EP that cannot run it.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.runtime.graphs import ModelGraphs
from wicore.runtime.kv_buffers import CacheConfig, KVBuffers
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
                "local_window_size": WINDOW - 1 if cfg.is_sliding(layer) else -1,
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
    assert manifest.partitions[-1].outputs[-2:] == (io.LOGITS, io.GREEDY_TOKENS)


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
