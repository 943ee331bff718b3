"""The vision partition (graph/vision.py), both flavours, against HF's vision tower +
projector, and what a multimodal export holds (tiny random Gemma3ForConditionalGeneration,
tests/multimodal.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from wicore.cli.export import main as export_main
from wicore.devices.placement import plan_placement
from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.hf import HFSource
from wicore.graph import io
from wicore.graph.manifest import Manifest, VisionRecord, sha256_file
from wicore.graph.ops import DataFile
from wicore.graph.vision import FLAVOURS, VisionBuilder


def hf_features(tiny, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return tiny.model.model.get_image_features(torch.tensor(pixels)).pooler_output.numpy()


PIXELS = np.random.default_rng(0).uniform(-1, 1, (3, 3, 56, 56)).astype(np.float32)
STANDARD, CONTRIB = ("", 17), ("com.microsoft", 1)


@pytest.fixture(scope="module")
def fused_export(tiny_multimodal, tmp_path_factory):
    """`wicore-export --vision-flavour fused` of the tiny multimodal model (fp32)."""
    out = tmp_path_factory.mktemp("fused") / "m"
    assert export_main(["--model", str(tiny_multimodal.folder), "--out", str(out), "--vision-flavour", "fused"]) == 0
    return out


def features(folder, pixels: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "vision.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {io.PIXEL_VALUES: pixels})[0]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_exported_vision_partition_equals_hf(tiny_multimodal, fused_export, flavour):
    folder = fused_export if flavour == "fused" else tiny_multimodal.export()
    ours = features(folder, PIXELS)
    ref = hf_features(tiny_multimodal, PIXELS)
    assert ours.shape == ref.shape == (3, 16, 64)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)  # measured: 2.0e-6 portable, 1.9e-6 fused (max |ref| 9.1)
    alone = features(folder, PIXELS[1:2])  # images do not see each other
    np.testing.assert_allclose(alone[0], ours[1], atol=1e-6, rtol=0)


def test_the_fused_graph_has_one_attention_and_one_gelu_node_a_layer_and_equals_the_portable_one(tiny_multimodal, fused_export):
    model = onnx.load(str(fused_export / "vision.onnx"), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("MultiHeadAttention") == ops.count("FastGelu") == 2  # 2 SigLIP layers
    assert "Softmax" not in ops and "Tanh" not in ops
    assert [(o.domain, o.version) for o in model.opset_import] == [STANDARD, CONTRIB]
    portable = features(tiny_multimodal.export(), PIXELS)
    np.testing.assert_allclose(features(fused_export, PIXELS), portable, atol=5e-6, rtol=0)  # measured 2.4e-6


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fp16_vision_graph_is_close_to_hf(tiny_multimodal, tmp_path, flavour):
    data = DataFile(tmp_path / "vision.onnx.data")
    model = VisionBuilder(HFSource(tiny_multimodal.folder).vision(), "fp16", flavour).build(data)
    data.close()
    onnx.save_model(model, tmp_path / "vision.onnx")
    onnx.checker.check_model(str(tmp_path / "vision.onnx"))
    opsets = [STANDARD] if flavour == "portable" else [STANDARD, CONTRIB]  # portable: standard ops only
    assert [(o.domain, o.version) for o in model.opset_import] == opsets
    ours = features(tmp_path, PIXELS)
    ref = hf_features(tiny_multimodal, PIXELS)
    assert ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 2e-3 * np.abs(ref).max()  # measured: 4.0e-4 portable, 3.3e-4 fused


def test_the_manifest_lists_the_vision_partition_with_its_preprocessing(tiny_multimodal):
    folder = tiny_multimodal.export()
    manifest = Manifest.read(folder)
    manifest.verify(folder)
    vision = manifest.vision
    assert vision is not None and vision.file == "vision.onnx"
    assert vision.inputs == (io.PIXEL_VALUES,) and vision.outputs == (io.IMAGE_FEATURES,)
    assert vision.flavour == "portable"
    cfg = vision.config
    assert (cfg.image_size, cfg.patch_size, cfg.mm_tokens_per_image, cfg.text_hidden_size) == (56, 7, 16, 64)
    raw = json.loads((folder / "wicore.json").read_text())["vision"]["config"]["preprocessing"]
    assert raw == {
        "height": 56,
        "width": 56,
        "resample": "bilinear",
        "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    for name in ("vision.onnx", "vision.onnx.data"):
        assert manifest.files[name] == sha256_file(folder / name)
    first = manifest.partitions[0]
    assert {io.IMAGE_EMBEDS, io.IMAGE_TOKEN_INDICES, io.ATTEND_UNTIL} <= set(first.inputs)
    older = {k: v for k, v in vision.to_dict().items() if k != "flavour"}  # written before the fused flavour
    assert VisionRecord.from_dict(older) == vision


def test_a_fused_export_says_so_and_plans_on_the_cpu(fused_export):
    manifest = Manifest.read(fused_export)
    assert manifest.vision is not None and manifest.vision.flavour == "fused"
    assert json.loads((fused_export / "wicore.json").read_text())["vision"]["flavour"] == "fused"
    assert manifest.op_flavour == "portable"  # the text graphs stay standard ONNX
    plan = plan_placement(fused_export, manifest, "cpu")
    assert plan.vision is not None and plan.vision.device.label == "cpu"


def test_the_vision_flavour_follows_the_op_flavour_unless_chosen():
    assert ExportConfig().resolved_vision_flavour() == "portable"
    assert ExportConfig(dtype="fp16").resolved_vision_flavour() == "portable"
    assert ExportConfig(op_flavour="ort-quant").resolved_vision_flavour() == "fused"  # contrib ops already needed
    assert ExportConfig(op_flavour="ort-quant", vision_flavour="portable").resolved_vision_flavour() == "portable"
    assert ExportConfig(dtype="fp16", vision_flavour="fused").resolved_vision_flavour() == "fused"
    with pytest.raises(WiCoreError, match="--vision-flavour 'flash': choose auto, portable, fused"):
        ExportConfig(vision_flavour="flash")


def test_a_text_only_export_has_no_image_inputs(tiny_export):
    folder, _ = tiny_export()
    manifest = Manifest.read(folder)
    assert manifest.vision is None
    assert json.loads((folder / "wicore.json").read_text())["vision"] is None
    names = {io.IMAGE_EMBEDS, io.IMAGE_TOKEN_INDICES, io.ATTEND_UNTIL}
    assert all(not names & set(p.inputs) for p in manifest.partitions)


def test_a_paged_export_leaves_the_vision_tower_out(tiny_multimodal, tmp_path):
    said = []
    config = ExportConfig(dtype="fp16", attention="paged", num_partitions=2)
    manifest = export_model(HFSource(tiny_multimodal.folder), tmp_path / "paged", config, progress=said.append)
    assert manifest.vision is None and not (tmp_path / "paged" / "vision.onnx").exists()
    assert any("vision tower is left out" in line and "--attention portable" in line for line in said)
    assert all(io.ATTEND_UNTIL not in p.inputs for p in manifest.partitions)
