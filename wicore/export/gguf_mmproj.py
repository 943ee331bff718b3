"""llama.cpp's mmproj GGUF as the vision source of a Gemma 3: `wicore-export --model text.gguf --mmproj mmproj.gguf`.

llama.cpp keeps a multimodal Gemma 3's vision tower and projector in a file of their own
(`convert_hf_to_gguf.py --mmproj`, `clip.projector_type` = gemma3), beside the text GGUF. Its
tensors are SigLIP's and the projector's under gguf-py's names, read back here into Hugging
Face's convention (wicore.model.vision.vision_shapes):

    v.patch_embd, v.position_embd               embeddings.patch_embedding, .position_embedding
    v.blk.{i}.attn_q / attn_k / attn_v / attn_out   encoder.layers.{i}.self_attn.q_proj / ... / out_proj
    v.blk.{i}.ln1 / ln2, ffn_up / ffn_down      ... .layer_norm1 / layer_norm2, mlp.fc1 / mlp.fc2
    v.post_ln                                   post_layernorm
    mm.soft_emb_norm (stored as 1 + w)          projector.norm.weight (w)
    mm.input_projection ([hidden, text width])  projector.projection

The header gives the shapes and the normalization (`clip.vision.*`); the image tokens' ids come
from the text model's vocabulary (`<image_soft_token>`, `<start_of_image>`, `<end_of_image>`),
which the text source looks up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wicore.errors import UnsupportedModelError
from wicore.export.gguf import GGUFFile, read_tensor
from wicore.model.vision import ImagePreprocessing, VisionConfig
from wicore.model.weights import LayerWeights, WeightSource

IMAGE_TOKENS = ("<image_soft_token>", "<start_of_image>", "<end_of_image>")
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
}
_TOP = {
    "embeddings.patch_embedding": "v.patch_embd",
    "embeddings.position_embedding": "v.position_embd",
    "post_layernorm": "v.post_ln",
    "projector.norm": "mm.soft_emb_norm",
    "projector.projection": "mm.input_projection",
}


def gguf_name(name: str) -> str:
    """The mmproj tensor of a short name (`encoder.layers.3.mlp.fc1.weight` -> `v.blk.3.ffn_up.weight`)."""
    if name == "projector.projection":
        return "mm.input_projection.weight"
    stem, _, suffix = name.rpartition(".")
    if stem.startswith("encoder.layers."):
        index, _, rest = stem[len("encoder.layers.") :].partition(".")
        return f"v.blk.{index}.{_LAYER[rest]}.{suffix}"
    return f"{_TOP[stem]}.{suffix}"


class MmprojVision(GGUFFile):
    """The vision tower and projector of an mmproj GGUF (wicore.model.vision.VisionWeights)."""

    def __init__(self, path: Path, token_ids: dict[str, int]) -> None:
        super().__init__(path, "mmproj")
        kind = self._field("clip.vision.projector_type", self._field("clip.projector_type"))
        if kind != "gemma3":
            raise UnsupportedModelError(f"{self.path.name}: projector type {kind!r}; WiCore reads Gemma 3's (gemma3)")
        missing = [t for t in IMAGE_TOKENS if t not in token_ids]
        if missing:
            raise UnsupportedModelError(f"the text model's vocabulary lacks {', '.join(missing)}: it is not a multimodal Gemma 3")
        self.config = self._read_config(token_ids)

    def _read_config(self, token_ids: dict[str, int]) -> VisionConfig:
        need = lambda key: self._need(f"clip.vision.{key}")
        image_size, patch_size = int(need("image_size")), int(need("patch_size"))
        tokens_per_side = image_size // patch_size // int(self._field("clip.vision.projector.scale_factor", 4))
        projection = self._need_tensor("mm.input_projection.weight")
        mean, std = (self._field(f"clip.vision.{key}", [0.5] * 3) for key in ("image_mean", "image_std"))
        preprocessing = ImagePreprocessing(
            image_size, image_size, image_mean=(mean[0], mean[1], mean[2]), image_std=(std[0], std[1], std[2])
        )
        return VisionConfig(
            image_size=image_size,
            patch_size=patch_size,
            hidden_size=int(need("embedding_length")),
            intermediate_size=int(need("feed_forward_length")),
            num_layers=int(need("block_count")),
            num_heads=int(need("attention.head_count")),
            text_hidden_size=int(projection.shape[0]),  # ggml order: [text width, hidden]
            mm_tokens_per_image=tokens_per_side**2,
            image_token_id=token_ids[IMAGE_TOKENS[0]],
            boi_token_id=token_ids[IMAGE_TOKENS[1]],
            eoi_token_id=token_ids[IMAGE_TOKENS[2]],
            preprocessing=preprocessing,
            layer_norm_eps=float(self._field("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        )

    def tensor(self, name: str) -> np.ndarray:
        data = read_tensor(self._need_tensor(gguf_name(name)))
        return data - 1.0 if name == "projector.norm.weight" else data  # llama.cpp stores Gemma's norm as 1 + w


class WithMmproj:
    """A text source (GGUF or HF folder) whose vision tower is an mmproj GGUF (a WeightSource)."""

    def __init__(self, text: WeightSource, mmproj: Path) -> None:
        self.text = text
        self.config = text.config
        self._vision = MmprojVision(mmproj, text.token_ids(IMAGE_TOKENS))

    def describe(self) -> dict[str, Any]:
        return {**self.text.describe(), "mmproj": str(self._vision.path)}

    def embedding(self) -> np.ndarray:
        return self.text.embedding()

    def final_norm(self) -> np.ndarray:
        return self.text.final_norm()

    def lm_head(self) -> np.ndarray | None:
        return self.text.lm_head()

    def layer(self, index: int) -> LayerWeights:
        return self.text.layer(index)

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        return self.text.write_tokenizer(out_dir)

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        return self.text.token_ids(tokens)

    def vision(self) -> MmprojVision:
        return self._vision
