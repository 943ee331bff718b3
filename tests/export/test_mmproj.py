"""llama.cpp's mmproj GGUF as a vision source (export/gguf_mmproj.py).

The mmproj file is written here as llama.cpp's converter writes one (`convert_hf_to_gguf.py
--mmproj`, class Gemma3VisionModel): gguf-py's own HF -> GGUF tensor name map, the projector's
RMSNorm stored as 1 + w, embeddings and 1-D tensors in F32, the rest in F16, the `clip.*` header.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from wicore.errors import UnsupportedModelError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.hf import HFSource
from wicore.export.sources import open_source
from wicore.graph import io


def write_mmproj(model, path: Path, projector_type: str = "gemma3") -> None:
    """The vision tower and projector of an HF Gemma3ForConditionalGeneration as llama.cpp converts them."""
    import gguf

    vision = model.config.vision_config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    for key, value in (
        ("image_size", vision.image_size),
        ("patch_size", vision.patch_size),
        ("embedding_length", vision.hidden_size),
        ("feed_forward_length", vision.intermediate_size),
        ("block_count", vision.num_hidden_layers),
        ("attention.head_count", vision.num_attention_heads),
        ("projector.scale_factor", vision.image_size // vision.patch_size // int(model.config.mm_tokens_per_image**0.5)),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", vision.layer_norm_eps)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, tensor in model.state_dict().items():
        if "vision_tower" not in name and "multi_modal_projector" not in name:
            continue
        hf = name.replace("model.vision_tower.", "vision_tower.vision_model.").replace(
            "model.multi_modal_projector.", "multi_modal_projector."
        )
        hf = hf.replace("_weight", ".weight")  # mm_input_projection_weight, as the converter renames it
        data = tensor.float().numpy()
        if hf.endswith("soft_emb_norm.weight"):
            data = data + 1
        f32 = data.ndim == 1 or ".embeddings." in hf
        writer.add_tensor(names.get_name(hf, try_suffixes=(".weight", ".bias")), data.astype(np.float32 if f32 else np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def mmproj(tiny_multimodal, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-f16.gguf"
    write_mmproj(tiny_multimodal.model, path)
    return path


def test_an_mmproj_gives_the_config_and_the_weights_of_the_hf_tower(tiny_multimodal, mmproj):
    ours = open_source(str(tiny_multimodal.folder), mmproj=mmproj).vision()
    hf = HFSource(tiny_multimodal.folder).vision()
    assert ours.config.layer_norm_eps == pytest.approx(hf.config.layer_norm_eps)  # a float32 in the GGUF header
    assert dataclasses.replace(ours.config, layer_norm_eps=hf.config.layer_norm_eps) == hf.config
    for name in ("encoder.layers.1.self_attn.q_proj.weight", "encoder.layers.1.mlp.fc1.weight", "projector.projection"):
        np.testing.assert_array_equal(ours.tensor(name), hf.tensor(name).astype(np.float16).astype(np.float32))  # F16
    for name in ("embeddings.patch_embedding.weight", "embeddings.position_embedding.weight", "post_layernorm.bias"):
        np.testing.assert_array_equal(ours.tensor(name), hf.tensor(name))  # F32
    np.testing.assert_allclose(ours.tensor("projector.norm.weight"), hf.tensor("projector.norm.weight"), atol=1e-6, rtol=0)


def test_an_export_with_the_mmproj_tower_matches_hf(tiny_multimodal, mmproj, tmp_path):
    import onnxruntime as ort
    import torch

    source = open_source(str(tiny_multimodal.folder), mmproj=mmproj)
    manifest = export_model(source, tmp_path / "m", ExportConfig(), progress=lambda _: None)
    assert manifest.vision is not None and manifest.source["mmproj"] == str(mmproj)
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 56, 56)).astype(np.float32)
    (ours,) = ort.InferenceSession(str(tmp_path / "m" / "vision.onnx")).run(None, {io.PIXEL_VALUES: pixels})
    with torch.no_grad():
        ref = tiny_multimodal.model.model.get_image_features(torch.tensor(pixels)).pooler_output.numpy()
    assert np.abs(ours - ref).max() < 1e-2 * np.abs(ref).max()  # the F16 weights


def test_an_mmproj_of_another_projector_is_refused(tiny_multimodal, tmp_path):
    write_mmproj(tiny_multimodal.model, tmp_path / "other.gguf", projector_type="idefics3")
    with pytest.raises(UnsupportedModelError, match="projector type 'idefics3'; WiCore reads Gemma 3's"):
        open_source(str(tiny_multimodal.folder), mmproj=tmp_path / "other.gguf")
