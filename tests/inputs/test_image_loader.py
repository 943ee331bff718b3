"""Image bytes -> pixels (runtime/image_loader.py) against HF's Gemma3ImageProcessorPil, and the images of a prompt (runtime/images.py)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from wicore.errors import RequestError
from wicore.inputs.image_loader import ImageError, ImageLimits, load_image
from wicore.model.vision import ImagePreprocessing, VisionConfig
from wicore.types.images import ImageInput, ImageSpan, block_keys, chunk_end, expand_images, image_spans

PREP = ImagePreprocessing(56, 56)
CFG = VisionConfig(56, 7, 32, 64, 2, 2, 64, 4, image_token_id=9, boi_token_id=8, eoi_token_id=7, preprocessing=PREP)


def encoded(pixels: np.ndarray, fmt: str, mode: str | None = None, **save: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, fmt, **save)
    return out.getvalue()


def image(seed: int) -> ImageInput:
    return ImageInput(np.full((2, 2, 3), seed, np.uint8))


RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (37, 61, 3), dtype=np.uint8)
RGBA = RNG.integers(0, 256, (30, 20, 4), dtype=np.uint8)


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return encoded(RGB, "JPEG", exif=exif.tobytes())


def gif(*pixels: np.ndarray) -> bytes:
    """An animated GIF of these frames (by default RGB, then its negative)."""
    frames = [Image.fromarray(p).convert("P") for p in pixels or (RGB, 255 - RGB)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()


CASES = {
    "png": lambda: encoded(RGB, "PNG"),
    "jpeg": lambda: encoded(RGB, "JPEG", quality=90),
    "webp": lambda: encoded(RGB, "WEBP"),
    "gif": gif,
    "rgba": lambda: encoded(RGBA, "PNG", "RGBA"),
    "gray": lambda: encoded(RGB[..., 0], "PNG"),
    "exif": exif_rotated,
}


@pytest.mark.parametrize("name", CASES)
def test_pixel_values_equal_hf_gemma3_image_processor(name):
    from PIL import ImageOps
    from transformers import Gemma3ImageProcessorPil

    data = CASES[name]()
    ours = PREP.pixel_values(load_image(data, PREP).pixels)
    hf = Gemma3ImageProcessorPil(size={"height": 56, "width": 56})
    ref = hf(ImageOps.exif_transpose(Image.open(io.BytesIO(data))), return_tensors="np")["pixel_values"][0]
    assert ours.shape == ref.shape == (3, 56, 56) and ours.dtype == ref.dtype == np.float32
    np.testing.assert_array_equal(ours, ref)


def test_a_gif_is_read_at_its_first_frame_and_exif_orientation_applies():
    assert load_image(gif(), PREP).digest == load_image(gif(RGB), PREP).digest != load_image(gif(255 - RGB), PREP).digest
    wide = ImagePreprocessing(8, 4)  # 4 wide, 8 high, as the rotated image is taller than wide
    assert load_image(exif_rotated(), wide).pixels.shape == (8, 4, 3)


def test_the_digest_is_of_the_pixels_not_the_bytes():
    png, webp = CASES["png"](), encoded(RGB, "WEBP", lossless=True)
    assert png != webp and load_image(png, PREP).digest == load_image(webp, PREP).digest
    assert load_image(png, PREP).digest != load_image(CASES["jpeg"](), PREP).digest


@pytest.mark.parametrize(
    "data, limits, message",
    [
        (b"not an image at all", ImageLimits(), "not a readable PNG, JPEG, WEBP, GIF image"),
        (encoded(RGB, "BMP"), ImageLimits(), "not a readable"),
        (encoded(RGB, "PNG")[:200], ImageLimits(), "truncated or corrupt"),
        (encoded(RGB, "PNG"), ImageLimits(max_bytes=100), "bytes; the limit is 100"),
        (encoded(RGB, "PNG"), ImageLimits(max_pixels=2000), "61x37 = 2257 pixels; the limit is 2000"),
    ],
    ids=["garbage", "bmp", "truncated", "bytes", "pixels"],
)
def test_bad_images_are_refused_with_the_reason(data, limits, message):
    with pytest.raises(ImageError, match=message):
        load_image(data, PREP, limits)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def with_text_chunk(png: bytes, num_bytes: int) -> bytes:
    """The PNG with a compressed text chunk that inflates to `num_bytes` (Pillow stops at MAX_TEXT_CHUNK)."""
    import zlib

    chunk = png_chunk(b"zTXt", b"comment\x00\x00" + zlib.compress(b"a" * num_bytes))
    return png[:33] + chunk + png[33:]  # after the signature and IHDR


# Issue 35: bytes on which Pillow raises other than UnidentifiedImageError (each was a 500).
MALFORMED = {
    "png-ihdr-cut": base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAg="),  # the repro: "Truncated File Read"
    "png-text-chunk-too-large": with_text_chunk(encoded(RGB, "PNG"), 2 << 20),  # ValueError
    "webp-cut": encoded(RGB, "WEBP")[:40],  # "could not create decoder object"
    "jpeg-cut-in-header": encoded(RGB, "JPEG")[:30],
    "gif-cut-in-header": gif()[:20],
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_images_are_image_errors(name):
    with pytest.raises(ImageError, match="not a readable|truncated or corrupt"):
        load_image(MALFORMED[name], PREP)


def test_mutated_images_load_or_raise_an_image_error_never_anything_else():
    """600 images of the four formats with random bytes changed, cut or repeated (the adversarial
    pass's corpus, seeded): each decodes, or is refused with an ImageError."""
    rng = np.random.default_rng(35)
    sources = [encoded(RGB, "PNG"), encoded(RGB, "JPEG"), encoded(RGBA, "WEBP"), gif(), encoded(RGBA, "PNG")]
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(600):
        data = bytearray(sources[i % len(sources)])
        for _ in range(int(rng.integers(1, 6))):
            at = int(rng.integers(0, len(data)))
            kind = int(rng.integers(0, 3))
            if kind == 0:
                data[at] = int(rng.integers(0, 256))
            elif kind == 1:
                del data[at:]
            else:
                data[at:at] = data[at : at + int(rng.integers(1, 64))]
            if not data:
                data = bytearray(b"x")
        try:
            assert load_image(bytes(data), PREP).pixels.shape == (56, 56, 3)
            outcomes["loaded"] += 1
        except ImageError:
            outcomes["refused"] += 1
    assert outcomes["loaded"] + outcomes["refused"] == 600 and outcomes["refused"] > 100


def test_expansion_is_hf_processors():
    text = "a<boi>b<boi>"
    assert expand_images(text, "<boi>", "<i>", "<eoi>", 2) == "a\n\n<boi><i><i><eoi>\n\nb\n\n<boi><i><i><eoi>\n\n"


def test_image_spans_are_the_runs_of_the_image_token():
    ids = [1, 8, 9, 9, 9, 9, 7, 5, 8, 9, 9, 9, 9, 7]
    a, b = image(1), image(2)
    assert image_spans(ids, [a, b], CFG) == (ImageSpan(2, 6, a), ImageSpan(9, 13, b))
    with pytest.raises(RequestError, match="2 image placeholder"):
        image_spans(ids, [a], CFG)
    with pytest.raises(RequestError, match="takes 4 image tokens in the prompt, found a run of 3"):
        image_spans([9, 9, 9, 1], [a], CFG)


def test_block_keys_name_every_block_an_image_touches():
    a, b = image(1), image(2)
    spans = [ImageSpan(2, 6, a), ImageSpan(7, 9, b)]
    assert block_keys(spans, 4) == {0: a.digest, 1: a.digest + b.digest, 2: b.digest}


@pytest.mark.parametrize(
    "start, end, expected",
    [(0, 2, 2), (0, 4, 2), (0, 6, 6), (0, 12, 10), (2, 5, 2), (3, 5, 3), (3, 6, 6), (6, 9, 9), (6, 12, 10), (10, 14, 14)],
)
def test_a_chunk_never_ends_inside_an_image(start, end, expected):
    spans = [ImageSpan(2, 6, image(1)), ImageSpan(10, 14, image(2))]
    assert chunk_end(spans, start, end) == expected
