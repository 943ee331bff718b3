"""Hugging Face folder source: config.json + *.safetensors (+ tokenizer files).

Safetensors files are memory-mapped and parsed directly (an 8-byte header
length, a JSON header, raw little-endian data), because the `safetensors`
NumPy frontend cannot return bfloat16, the dtype Gemma checkpoints ship in.
Only the tensors of the layer being built are converted to float32.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from wicore.errors import ModelSourceError
from wicore.export.stacked_experts import unstack_experts
from wicore.model.config import DecoderConfig
from wicore.model.vision import VisionConfig
from wicore.model.weights import LayerWeights, expected_shapes

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U8": np.uint8}  # U8: MXFP4 blocks and scales
# Where the text decoder lives in the checkpoints of the text-only and multimodal Gemma 3 classes.
_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
# ... and the vision tower (SigLIP's `vision_model.` level is gone from transformers 5's own saves).
_VISION_PREFIXES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.", "model.vision_tower.")
_PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
# short name (wicore.model.vision.vision_shapes) -> the projector's tensor in the checkpoint
_PROJECTOR_NAMES = {"projector.norm.weight": "mm_soft_emb_norm.weight", "projector.projection": "mm_input_projection_weight"}


class SafetensorsIndex:
    """Name -> (memory map, dtype, shape) over every *.safetensors file of a folder."""

    def __init__(self, folder: Path) -> None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelSourceError(f"{folder}: no *.safetensors files")
        self.folder = folder
        self._entries: dict[str, tuple[Path, int, str, tuple[int, ...], tuple[int, int]]] = {}
        for path in files:
            with path.open("rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise ModelSourceError(f"{path} is truncated (no safetensors header)")
                (header_len,) = struct.unpack("<Q", raw)
                try:
                    header = json.loads(f.read(header_len))
                except ValueError as exc:
                    raise ModelSourceError(f"{path}: corrupt safetensors header") from exc
            size = path.stat().st_size
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                begin, end = meta["data_offsets"]
                if 8 + header_len + end > size:
                    raise ModelSourceError(f"{path} is truncated: tensor {name} runs past the end of the file")
                self._entries[name] = (path, 8 + header_len, meta["dtype"], tuple(meta["shape"]), (begin, end))

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 (bf16 widened exactly: its bits are the top half of an fp32)."""
        if name not in self._entries:
            raise ModelSourceError(f"{self.folder}: tensor {name} is missing")
        path, base, dtype, shape, (begin, _end) = self._entries[name]
        if dtype not in _DTYPES:
            raise ModelSourceError(f"{path.name}: tensor {name} has dtype {dtype}; F32, F16, BF16 and U8 are supported")
        raw = np.memmap(path, dtype=_DTYPES[dtype], mode="r", offset=base + begin, shape=shape)
        if dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return np.array(raw, dtype=np.float32)


class HFSource:
    """A Hugging Face Gemma 3 folder (Gemma3ForCausalLM or the text half of Gemma3ForConditionalGeneration)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        config_path = self.folder / "config.json"
        if not config_path.is_file():
            raise ModelSourceError(f"{self.folder}: no config.json (expected a Hugging Face model folder)")
        try:
            self._hf_config = json.loads(config_path.read_text())
        except ValueError as exc:
            raise ModelSourceError(f"{config_path}: invalid JSON ({exc})") from exc
        self.config = DecoderConfig.from_hf(self._hf_config)
        self._index = SafetensorsIndex(self.folder)
        prefix = next((p for p in _PREFIXES if f"{p}embed_tokens.weight" in self._index), None)
        if prefix is None:
            raise ModelSourceError(f"{self.folder}: no embed_tokens.weight under {', '.join(_PREFIXES)}")
        self._prefix: str = prefix

    def _tensor(self, name: str) -> np.ndarray:
        return self._index.load(self._prefix + name)

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "path": str(self.folder), "architectures": self._hf_config.get("architectures")}

    def embedding(self) -> np.ndarray:
        return self._tensor("embed_tokens.weight")

    def final_norm(self) -> np.ndarray:
        return self._tensor("norm.weight")

    def lm_head(self) -> np.ndarray | None:
        if self.config.tie_word_embeddings:
            return None
        return self._index.load("lm_head.weight")

    def layer(self, index: int) -> LayerWeights:
        """The layer's tensors under WiCore's names (wicore.model.families: `hf_names`, a name
        with an expert's index as `{e}`; `hf_fused` tensors split by rows)."""
        row = self.config.family_row
        shapes = expected_shapes(self.config)
        tensors: dict[str, np.ndarray] = {}
        if row.hf_stacked_experts:
            layer = f"layers.{index}."
            tensors.update(
                unstack_experts(
                    lambda n: self._tensor(layer + n), lambda n: self._prefix + layer + n in self._index, self.config.num_experts
                )
            )
        for fused, parts in row.hf_fused.items():
            if self._prefix + f"layers.{index}.{fused}.weight" in self._index:
                data = self._tensor(f"layers.{index}.{fused}.weight")
                ends = np.cumsum([shapes[part][0] for part in parts])[:-1]
                tensors.update(zip(parts, np.split(data, ends, axis=0)))
        for name in shapes:
            if name not in tensors:
                stored = hf_name(row.hf_names, name)
                bare = stored.endswith((".bias", ".sinks"))  # a bias or gpt-oss's sinks: no `.weight`
                tensors[name] = self._tensor(f"layers.{index}.{stored}" + ("" if bare else ".weight"))
        return LayerWeights(index, tensors)

    def vision(self) -> HFVision | None:
        """The vision tower and projector of a Gemma3ForConditionalGeneration folder; None for text-only ones."""
        processor_path = self.folder / "preprocessor_config.json"
        try:
            processor = json.loads(processor_path.read_text()) if processor_path.is_file() else {}
        except ValueError as exc:
            raise ModelSourceError(f"{processor_path}: invalid JSON ({exc})") from exc
        config = VisionConfig.from_hf(self._hf_config, processor)
        return None if config is None else HFVision(self.folder, self._index, config)

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """The vocabulary ids of those of `tokens` that tokenizer.json has (none without one)."""
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            return {}
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(path))
        return {t: i for t in tokens if (i := vocab.token_to_id(t)) is not None}

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        from wicore.export.tokenizer import export_tokenizer_from_hf

        info = export_tokenizer_from_hf(self.folder, out_dir, self.config.family)
        return None if info is None else info.to_dict()


def hf_name(names: dict[str, str], name: str) -> str:
    """The checkpoint's name of a per-layer tensor: `names[name]`, or for an expert's tensor
    (`mlp.experts.3.up_proj`) `names["mlp.experts.{e}.up_proj"]` with its index; else `name`."""
    if name in names:
        return names[name]
    found = re.fullmatch(r"(.*experts\.)(\d+)(\..*)", name)
    if found is None:
        return name
    template = names.get(found[1] + "{e}" + found[3])
    return name if template is None else template.format(e=found[2])


class HFVision:
    """The SigLIP tower and the projector of a multimodal Gemma 3 folder (wicore.model.vision.VisionWeights)."""

    def __init__(self, folder: Path, index: SafetensorsIndex, config: VisionConfig) -> None:
        self.folder = folder
        self.config = config
        self._index = index
        anchor = "embeddings.patch_embedding.weight"
        prefix = next((p for p in _VISION_PREFIXES if p + anchor in index), None)
        projector = next((p for p in _PROJECTOR_PREFIXES if p + "mm_input_projection_weight" in index), None)
        if prefix is None or projector is None:
            raise ModelSourceError(
                f"{folder}: config.json describes a vision tower but the safetensors lack its weights "
                f"(vision_tower.*{anchor}, multi_modal_projector.mm_input_projection_weight)"
            )
        self._prefix: str = prefix
        self._projector: str = projector

    def tensor(self, name: str) -> np.ndarray:
        return self._index.load(self._projector + _PROJECTOR_NAMES[name] if name in _PROJECTOR_NAMES else self._prefix + name)
