"""Images in a prompt: where their soft tokens are, and what the prefix cache hashes with them.

A chat template writes `<start_of_image>` for each image; `expand_images` replaces it with the
sequence HF's Gemma3Processor writes (text, before tokenizing, so that the ids are HF's):

    "Describe <start_of_image> please"
    -> "Describe \\n\\n<start_of_image><image_soft_token> x N<end_of_image>\\n\\n please"

In the token ids, the i-th run of N `<image_soft_token>`s is the i-th image's span [start, stop):
the positions its N embeddings fill, attending to each other both ways (wicore.graph.io).

Two requests with the same ids but different images must never share KV: every block that
holds a soft token of an image is hashed with the image's digest (`block_keys`), so the prefix
cache tells them apart. The digest is the sha256 of the preprocessed pixels, which are all the
vision tower sees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from wicore.errors import ImageTokenError, RequestError
from wicore.model.vision import VisionConfig


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image, preprocessed up to its resized RGB pixels [height, width, 3] uint8 (the vision
    partition's float input is derived from these by `pixel_values`)."""

    pixels: np.ndarray
    digest: bytes = field(init=False)

    def __post_init__(self) -> None:
        if self.pixels.dtype != np.uint8 or self.pixels.ndim != 3 or self.pixels.shape[2] != 3:
            raise ValueError(f"pixels must be [height, width, 3] uint8, got {self.pixels.shape} {self.pixels.dtype}")
        shape = np.asarray(self.pixels.shape, np.int64).tobytes()
        object.__setattr__(self, "digest", hashlib.sha256(shape + np.ascontiguousarray(self.pixels).tobytes()).digest())


@dataclass(frozen=True)
class ImageSpan:
    """The soft tokens [start, stop) of one image in a sequence."""

    start: int
    stop: int
    image: ImageInput


@dataclass(frozen=True)
class ImagePlacement:
    """Where a model's images go in its prompts: what the API and admission need of the vision
    partition, apart from its session (so it pickles: an engine in another process sends it over)."""

    config: VisionConfig

    def expand(self, text: str, tokenizer: HasVocabulary) -> str:
        """`text` with each `<start_of_image>` as the image's tokens (expand_images); ImageTokenError
        where the tokenizer lacks them."""
        boi, image, eoi = image_token_texts(tokenizer.id_to_token, self.config)
        return expand_images(text, boi, image, eoi, self.config.mm_tokens_per_image)

    def spans(self, token_ids: Sequence[int], images: Sequence[ImageInput]) -> tuple[ImageSpan, ...]:
        """Where `images` go in a prompt (image_spans)."""
        return image_spans(token_ids, images, self.config)


class HasVocabulary(Protocol):
    def id_to_token(self, token_id: int) -> str | None: ...


def expand_images(text: str, boi: str, image_token: str, eoi: str, num_tokens: int) -> str:
    """Each `boi` of the text as HF's Gemma3Processor expands it (module docstring)."""
    return text.replace(boi, f"\n\n{boi}{image_token * num_tokens}{eoi}\n\n")


def image_token_texts(id_to_token: Callable[[int], str | None], cfg: VisionConfig) -> tuple[str, str, str]:
    """The texts of the vision config's image-start, image and image-end tokens in a vocabulary
    (`id_to_token`, a tokenizer's); ImageTokenError naming the ids it lacks (a vision config and a
    tokenizer that disagree), rather than a prompt of "None"s or of nothing where images go."""
    ids = (cfg.boi_token_id, cfg.image_token_id, cfg.eoi_token_id)
    texts = [id_to_token(i) for i in ids]
    missing = [str(i) for i, text in zip(ids, texts) if text is None]
    if missing:
        raise ImageTokenError(
            f"this model's image token{'s' if len(missing) > 1 else ''} (id {', '.join(missing)}) "
            f"{'are' if len(missing) > 1 else 'is'} not in its tokenizer's vocabulary, so images have no place in a "
            "prompt: export the model with the tokenizer of its vision tower"
        )
    boi, image, eoi = texts
    assert boi is not None and image is not None and eoi is not None
    return boi, image, eoi


def image_spans(token_ids: Sequence[int], images: Sequence[ImageInput], cfg: VisionConfig) -> tuple[ImageSpan, ...]:
    """The spans of `images` in a prompt: the runs of the image token, in order, one an image and
    each mm_tokens_per_image long. Raises RequestError when the prompt does not hold exactly one
    run per image."""
    ids = np.asarray(token_ids, np.int64)
    is_image = np.concatenate([[False], ids == cfg.image_token_id, [False]])
    edges = np.flatnonzero(is_image[1:] != is_image[:-1])  # starts and stops, alternating
    runs = list(zip(edges[::2].tolist(), edges[1::2].tolist()))
    if len(runs) != len(images):
        raise RequestError(
            f"the prompt has {len(runs)} image placeholder(s) and {len(images)} image(s); write one "
            "<start_of_image> per image (the chat template does this for image content parts)"
        )
    for start, stop in runs:
        if stop - start != cfg.mm_tokens_per_image:
            raise RequestError(
                f"an image takes {cfg.mm_tokens_per_image} image tokens in the prompt, found a run of {stop - start}"
            )
    return tuple(ImageSpan(start, stop, image) for (start, stop), image in zip(runs, images))


def block_keys(spans: Sequence[ImageSpan], block_size: int) -> dict[int, bytes]:
    """Logical block -> the digests of the images with soft tokens in it, in order: what the
    prefix cache hashes with the block's token ids (wicore.blocks.block_pool)."""
    keys: dict[int, bytes] = {}
    for span in spans:
        for block in range(span.start // block_size, (span.stop - 1) // block_size + 1):
            keys[block] = keys.get(block, b"") + span.image.digest
    return keys


def chunk_end(spans: Sequence[ImageSpan], start: int, end: int) -> int:
    """Where a prefill chunk [start, end) may end so that it cuts no image: a chunk that would
    end inside an image ends before it instead (at `start` itself, running nothing, when it
    begins at or inside that image: the image waits for a step with room for all of it)."""
    for span in spans:
        if span.start < end < span.stop:
            return max(start, span.start)
    return end
