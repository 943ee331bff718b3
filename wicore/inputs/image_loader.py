"""Image bytes -> ImageInput, with Pillow and NumPy, as HF's Gemma3ImageProcessor prepares an image.

    bytes ──► Pillow (PNG, JPEG, WebP, GIF: its first frame) ──► EXIF orientation applied
          ──► RGB (transparency composited onto white) ──► resized to the tower's size with the
              processor's filter (bilinear for Gemma 3) ──► [height, width, 3] uint8 + its sha256

The rescale and normalization that follow are `ImagePreprocessing.pixel_values` (run when the
image is encoded), so the float pixel values are HF's `Gemma3ImageProcessorPil` output exactly.
HF's torchvision backend (`Gemma3ImageProcessor` where torchvision is installed) resizes with
its own bilinear kernel and differs from Pillow by a few levels in some pixels.

Limits are checked before anything is decoded: the encoded bytes, and the pixels the header
announces (a small PNG can announce a 100,000 x 100,000 image).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from wicore.errors import RequestError
from wicore.model.vision import ImagePreprocessing
from wicore.types.images import ImageInput

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")

# Pillow's decoders raise what they like on hostile bytes: OSError ("Truncated File Read", WebP's
# "could not create decoder object"), ValueError (a PNG text chunk past MAX_TEXT_CHUNK),
# SyntaxError, EOFError, struct.error, IndexError, ZeroDivisionError..., a list that changes from
# one Pillow to the next. Every exception raised while Pillow reads a request's bytes is therefore
# a bad image (a 400 naming its part), never a server error; MemoryError included (an image that
# announces more than the limits let through).
DECODER_ERRORS = (Exception,)


class ImageError(RequestError):
    """An image that cannot be used: not an image, of another format, truncated, or over a limit."""


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20  # encoded bytes of one image (OpenAI's limit is 20 MB)
    max_pixels: int = 25_000_000  # width x height of one decoded image

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1:
            raise ValueError("image limits must be positive")


def load_image(data: bytes, prep: ImagePreprocessing, limits: ImageLimits = ImageLimits()) -> ImageInput:
    """Decode and resize one image; ImageError says what is wrong with it."""
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image has {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (UnidentifiedImageError, Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageError(f"not a readable {', '.join(FORMATS)} image ({exc})") from None
    except DECODER_ERRORS as exc:
        raise ImageError(f"the image cannot be decoded, truncated or corrupt ({_reason(exc)})") from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageError(f"the image is {width}x{height} = {width * height} pixels; the limit is {limits.max_pixels}")
    try:
        image.seek(0)  # an animation's first frame
        rgb = to_rgb(ImageOps.exif_transpose(image))
        # prep.resample names a member of PIL's Resampling (wicore.model.vision.RESAMPLING).
        resized = rgb.resize((prep.width, prep.height), resample=Image.Resampling[prep.resample.upper()])
        pixels = np.asarray(resized, dtype=np.uint8)
    except DECODER_ERRORS as exc:
        raise ImageError(f"the image cannot be decoded, truncated or corrupt ({_reason(exc)})") from None
    return ImageInput(pixels)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, transparency composited onto a white background (HF's convert_to_rgb)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
