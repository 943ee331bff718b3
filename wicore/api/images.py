"""Images of a request: `image_url` content parts (chat) and `images` (/v1/inference) -> ImageInputs.

    part.url ──► data:image/...;base64,...  ──► base64 ──┐
             └─► http(s)://...  (only with --allow-image-urls: public addresses, size limit,
                 one deadline; wicore.api.image_fetch, on the event loop) ──┤
                                                          ▼
                 wicore.inputs.image_loader.load_image (Pillow, in a worker thread) ──► ImageInput

Every failure is a 400 whose `param` names the content part (`messages[0].content[1]`), with a
message that says what to do. The limits (`ImageSettings`): images a request, encoded bytes and
decoded pixels of one image; remote URLs are refused unless the operator turns fetching on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from wicore.api.errors import APIError
from wicore.api.image_fetch import Network, fetch_image
from wicore.inputs.image_loader import ImageError, ImageLimits, load_image
from wicore.model.vision import ImagePreprocessing
from wicore.types.images import ImageInput

_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*),(?P<data>.*)", re.DOTALL)


@dataclass(frozen=True)
class ImagePart:
    """One image of a request, as sent: its URL (data: or http(s):) and the request field it came in."""

    url: str
    param: str


@dataclass(frozen=True)
class ImageSettings:
    max_images: int = 8  # images one request may carry
    limits: ImageLimits = field(default_factory=ImageLimits)  # encoded bytes and decoded pixels of one image
    fetch_urls: bool = False  # http(s) image URLs: fetched (the operator's choice), or a 400
    fetch_timeout: float = 10.0  # seconds for the whole fetch of one image, redirects included
    # Networks (CIDR) fetched from although not public: deliberate intranet use (image_fetch.py).
    fetch_allowed_networks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_images < 0 or self.fetch_timeout <= 0:
            raise ValueError("max_images must be >= 0 and the fetch timeout > 0")
        self.allowed_networks()

    def allowed_networks(self) -> tuple[Network, ...]:
        try:
            return tuple(ipaddress.ip_network(n, strict=False) for n in self.fetch_allowed_networks)
        except ValueError as exc:
            raise ValueError(f"fetch_allowed_networks: {exc} (write networks as 10.0.0.0/8 or fd00::/8)") from None


async def load_images(parts: Sequence[ImagePart], prep: ImagePreprocessing, settings: ImageSettings) -> list[ImageInput]:
    """The request's images, decoded and resized for the model, in order."""
    if len(parts) > settings.max_images:
        raise APIError(
            400,
            f"{parts[settings.max_images].param}: this request has {len(parts)} images; the server takes at most "
            f"{settings.max_images} a request",
            param=parts[settings.max_images].param,
            code="too_many_images",
        )
    images = []
    for part in parts:
        try:
            data = await _image_bytes(part.url, settings)
            images.append(await asyncio.to_thread(load_image, data, prep, settings.limits))
        except ImageError as exc:
            raise APIError(400, f"{part.param}: {exc}", param=part.param, code="invalid_image") from None
    return images


async def _image_bytes(url: str, settings: ImageSettings) -> bytes:
    if url.startswith("data:"):
        return _data_url_bytes(url, settings.limits.max_bytes)
    if url.startswith(("http://", "https://")):
        if not settings.fetch_urls:
            raise ImageError(
                "this server does not fetch image URLs: send the image inline as a data: URL "
                "(data:image/png;base64,...), or start the server with --allow-image-urls"
            )
        return await fetch_image(url, settings.fetch_timeout, settings.limits.max_bytes, settings.allowed_networks())
    raise ImageError("expected a data: URL (data:image/png;base64,...) or an http(s) URL")


def _data_url_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a base64 data: URL, checked against `max_bytes` before decoding."""
    match = _DATA_URL.fullmatch(url)
    if match is None or ";base64" not in match["params"]:
        raise ImageError("a data: URL must be data:image/<type>;base64,<data>")
    if match["type"] and not match["type"].startswith("image/"):
        raise ImageError(f"a data: URL of type {match['type']}; send an image (PNG, JPEG, WebP, GIF)")
    text = "".join(match["data"].split())
    if len(text) // 4 * 3 > max_bytes:
        raise ImageError(f"the image has about {len(text) // 4 * 3} bytes; the limit is {max_bytes}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URL is not valid base64") from None


def check_placeholders(prompts: Sequence[Sequence[int]], num_images: int, boi_token_id: int, param: str) -> None:
    """A 400 unless every prompt holds one image placeholder (`<start_of_image>`) per image: one
    without its image would reach the model as a bare control token."""
    for ids in prompts:
        num_placeholders = list(ids).count(boi_token_id)
        if num_placeholders != num_images:
            raise APIError(
                400,
                f"{param}: the prompt has {num_placeholders} image placeholder(s) (<start_of_image>) and "
                f"{num_images} image(s); write one placeholder per image",
                param=param,
                code="invalid_request",
            )
