"""The vision partition (graph/vision.py) against HF's vision tower + projector, and what a
multimodal export holds (tiny random Gemma3ForConditionalGeneration, tests/multimodal.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.hf import HFSource
from wicore.graph import io
from wicore.graph.manifest import Manifest, sha256_file
from wicore.graph.ops import DataFile
from wicore.graph.vision import VisionBuilder


def hf_features(tiny, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return tiny.model.model.get_image_features(torch.tensor(pixels)).pooler_output.numpy()


PIXELS = np.random.default_rng(0).uniform(-1, 1, (3, 3, 56, 56)).astype(np.float32)


def test_the_exported_vision_partition_equals_hf(tiny_multimodal):
    folder = tiny_multimodal.export()
    session = ort.InferenceSession(str(folder / "vision.onnx"))
    (ours,) = session.run(None, {io.PIXEL_VALUES: PIXELS})
    ref = hf_features(tiny_multimodal, PIXELS)
    assert ours.shape == ref.shape == (3, 16, 64)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
    (alone,) = session.run(None, {io.PIXEL_VALUES: PIXELS[1:2]})  # images do not see each other
    np.testing.assert_allclose(alone[0], ours[1], atol=1e-6, rtol=0)


def test_fp16_vision_graph_is_close_to_hf(tiny_multimodal, tmp_path):
    data = DataFile(tmp_path / "vision.onnx.data")
    model = VisionBuilder(HFSource(tiny_multimodal.folder).vision(), "fp16").build(data)
    data.close()
    onnx.save_model(model, tmp_path / "vision.onnx")
    onnx.checker.check_model(str(tmp_path / "vision.onnx"))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]  # standard ops only
    (ours,) = ort.InferenceSession(str(tmp_path / "vision.onnx")).run(None, {io.PIXEL_VALUES: PIXELS})
    ref = hf_features(tiny_multimodal, PIXELS)
    assert ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 2e-3 * np.abs(ref).max()


def test_the_manifest_lists_the_vision_partition_with_its_preprocessing(tiny_multimodal):
    folder = tiny_multimodal.export()
    manifest = Manifest.read(folder)
    manifest.verify(folder)
    vision = manifest.vision
    assert vision is not None and vision.file == "vision.onnx"
    assert vision.inputs == (io.PIXEL_VALUES,) and vision.outputs == (io.IMAGE_FEATURES,)
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
