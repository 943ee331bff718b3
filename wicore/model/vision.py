"""What the graph builder and the runtime need to know about a Gemma 3 vision tower, from any source.

Gemma 3 (4B and up) reads an image through a SigLIP encoder and a small projector:

    image ──► resize to image_size², rescale, normalize ──► pixel values [3, 896, 896]
          ──► patches of patch_size² (14: 64 x 64 = 4,096 patches) ──► SigLIP, num_layers layers
          ──► average pool to tokens_per_side² (16 x 16 = 256) ──► RMSNorm, linear map to the text width
          ──► 256 embeddings that replace the image's soft tokens in the prompt:

    ... text \\n\\n <start_of_image> <image_soft_token> x 256 <end_of_image> \\n\\n text ...

`VisionConfig` holds the shapes, the prompt's special token ids and `ImagePreprocessing`,
the settings of HF's image processor (stored in wicore.json beside the graphs). `VisionWeights`
is what a source hands the builder: tensors by the short names of `vision_shapes`, in Hugging
Face's convention (linear weights [out, in]; the projector's RMSNorm weight is the `w` of
`x * (1 + w)`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from wicore.errors import UnsupportedModelError

# PIL's resampling filters by the numbers HF image processor configs store (PIL.Image.Resampling).
RESAMPLING = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image becomes pixel values: HF's Gemma3ImageProcessor with pan-and-scan off (its default):
    RGB (transparency composited onto white), resized to height x width with `resample`, times
    `rescale_factor`, then (x - mean) / std per channel."""

    height: int
    width: int
    resample: str = "bilinear"
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        if self.resample not in RESAMPLING.values():
            raise UnsupportedModelError(f"image resampling {self.resample!r}: expected one of {sorted(RESAMPLING.values())}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise UnsupportedModelError(f"image mean {self.image_mean} / std {self.image_std}: expected 3 values, std > 0")

    def pixel_values(self, pixels: np.ndarray) -> np.ndarray:
        """Resized RGB pixels [height, width, 3] uint8 -> the vision tower's input [3, height, width]
        float32, in HF's arithmetic: the rescale in float64 cast to float32, then (x - mean) / std
        in float32 (so the values are HF's bit for bit)."""
        rescaled = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        normalized = (rescaled - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
        return np.ascontiguousarray(normalized.transpose(2, 0, 1))

    @classmethod
    def from_hf(cls, processor: dict[str, Any], image_size: int) -> ImagePreprocessing:
        """From an HF preprocessor_config.json (an empty dict: the processor's defaults)."""
        if processor.get("do_pan_and_scan"):
            raise UnsupportedModelError("the image processor has do_pan_and_scan on; WiCore encodes whole images only")
        size = processor.get("size") or {"height": image_size, "width": image_size}
        if "height" not in size or "width" not in size:
            raise UnsupportedModelError(f"image processor size {size}: expected height and width")
        normalize = processor.get("do_normalize", True)
        mean = _rgb(processor.get("image_mean", 0.5)) if normalize else (0.0, 0.0, 0.0)
        std = _rgb(processor.get("image_std", 0.5)) if normalize else (1.0, 1.0, 1.0)
        return cls(
            height=int(size["height"]),
            width=int(size["width"]),
            resample=RESAMPLING.get(int(processor.get("resample", 2)), "unknown"),
            rescale_factor=float(processor.get("rescale_factor", 1 / 255)) if processor.get("do_rescale", True) else 1.0,
            image_mean=mean,
            image_std=std,
        )


def _rgb(value: float | list[float]) -> tuple[float, float, float]:
    """One value per channel: a processor config's mean or std (a number, or three)."""
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise UnsupportedModelError(f"image mean / std {value}: expected 3 values")
    return values[0], values[1], values[2]


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP vision encoder and Gemma 3's multi-modal projector, and the image tokens of the prompt."""

    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    text_hidden_size: int
    mm_tokens_per_image: int
    image_token_id: int  # <image_soft_token>: the positions the embeddings replace
    boi_token_id: int  # <start_of_image>: what a chat template writes for an image
    eoi_token_id: int  # <end_of_image>
    preprocessing: ImagePreprocessing
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        side = self.tokens_per_side
        if self.image_size % self.patch_size:
            raise UnsupportedModelError(f"image size {self.image_size} is not a multiple of the patch size {self.patch_size}")
        if side * side != self.mm_tokens_per_image or self.patches_per_side % side:
            raise UnsupportedModelError(
                f"mm_tokens_per_image {self.mm_tokens_per_image} must be a square whose side divides the "
                f"{self.patches_per_side} patches a side"
            )
        if self.hidden_size % self.num_heads:
            raise UnsupportedModelError(f"vision hidden size {self.hidden_size} is not a multiple of {self.num_heads} heads")
        if (self.preprocessing.height, self.preprocessing.width) != (self.image_size, self.image_size):
            raise UnsupportedModelError(
                f"the image processor resizes to {self.preprocessing.height}x{self.preprocessing.width}, "
                f"the vision tower takes {self.image_size}x{self.image_size}"
            )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_side(self) -> int:
        return round(self.mm_tokens_per_image**0.5)

    @property
    def pool_size(self) -> int:
        """Patches a side that average into one token (4 for Gemma 3: 64 -> 16)."""
        return self.patches_per_side // self.tokens_per_side

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VisionConfig:
        """Inverse of `to_dict` (the manifest's `vision.config`)."""
        prep = dict(d["preprocessing"])
        prep["image_mean"], prep["image_std"] = tuple(prep["image_mean"]), tuple(prep["image_std"])
        return cls(**{**d, "preprocessing": ImagePreprocessing(**prep)})

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], processor: dict[str, Any]) -> VisionConfig | None:
        """From a Gemma3ForConditionalGeneration config.json and its preprocessor_config.json
        (empty: HF's defaults); None for a text-only config."""
        vision = cfg.get("vision_config")
        if not vision:
            return None
        if vision.get("model_type", "siglip_vision_model") != "siglip_vision_model":
            raise UnsupportedModelError(f"vision model_type {vision.get('model_type')!r}: WiCore compiles SigLIP (Gemma 3)")
        if vision.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise UnsupportedModelError(f"vision hidden_act {vision.get('hidden_act')!r}: expected gelu_pytorch_tanh")
        image_size = int(vision.get("image_size", 896))
        return cls(
            image_size=image_size,
            patch_size=int(vision.get("patch_size", 14)),
            hidden_size=int(vision["hidden_size"]),
            intermediate_size=int(vision["intermediate_size"]),
            num_layers=int(vision["num_hidden_layers"]),
            num_heads=int(vision["num_attention_heads"]),
            text_hidden_size=int(cfg["text_config"]["hidden_size"]),
            mm_tokens_per_image=int(cfg.get("mm_tokens_per_image", 256)),
            image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 262_144))),
            boi_token_id=int(cfg.get("boi_token_index", cfg.get("boi_token_id", 255_999))),
            eoi_token_id=int(cfg.get("eoi_token_index", cfg.get("eoi_token_id", 256_000))),
            preprocessing=ImagePreprocessing.from_hf(processor, image_size),
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
        )


class VisionWeights(Protocol):
    """A source's vision tower and projector, tensors by the names of `vision_shapes` (float32)."""

    config: VisionConfig

    def tensor(self, name: str) -> np.ndarray:
        """One tensor by its short name (`layers.3.self_attn.q_proj.weight`, `projector.norm.weight`)."""


def vision_shapes(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the builder reads, by short name: SigLIP's under its `vision_model.` names,
    the projector's as `projector.norm.weight` and `projector.projection` ([hidden, text_hidden])."""
    h, m, p = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.patch_embedding.weight": (h, 3, p, p),
        "embeddings.patch_embedding.bias": (h,),
        "embeddings.position_embedding.weight": (cfg.patches_per_side**2, h),
        "post_layernorm.weight": (h,),
        "post_layernorm.bias": (h,),
        "projector.norm.weight": (h,),
        "projector.projection": (h, cfg.text_hidden_size),
    }
    for i in range(cfg.num_layers):
        q = f"encoder.layers.{i}"
        for name in ("layer_norm1", "layer_norm2"):
            shapes[f"{q}.{name}.weight"] = shapes[f"{q}.{name}.bias"] = (h,)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{q}.self_attn.{name}.weight"] = (h, h)
            shapes[f"{q}.self_attn.{name}.bias"] = (h,)
        shapes[f"{q}.mlp.fc1.weight"], shapes[f"{q}.mlp.fc1.bias"] = (m, h), (m,)
        shapes[f"{q}.mlp.fc2.weight"], shapes[f"{q}.mlp.fc2.bias"] = (h, m), (h,)
    return shapes


def checked_tensor(weights: VisionWeights, name: str) -> np.ndarray:
    """`weights.tensor(name)` as float32, after checking its shape against the config."""
    expected = vision_shapes(weights.config)[name]
    tensor = np.asarray(weights.tensor(name), dtype=np.float32)
    if tuple(tensor.shape) != expected:
        raise UnsupportedModelError(f"vision tensor {name} has shape {tuple(tensor.shape)}, the config implies {expected}")
    return tensor
