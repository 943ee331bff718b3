"""The vision partition at run time: images -> embeddings (each distinct image encoded once), and
the decoder's image inputs for a batch of rows (wicore.graph.io, "Images").

    rows' images ──► features(images): cached by digest, the rest encoded in batches ──┐
                                                                                         ▼
    rows ──► decoder_inputs(rows, seq_len, features) ──► image_embeds, image_token_indices, attend_until

The vision session may run on another device than the decoder partitions (`--vision-device`):
its output comes back to host memory, where the decoder's inputs are assembled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from wicore.devices.providers import Device, onnxruntime, session_options
from wicore.graph import io
from wicore.graph.manifest import VisionRecord
from wicore.inputs.tokenizer import Tokenizer
from wicore.types.images import ImageInput, ImagePlacement, ImageSpan
from wicore.types.step import ScheduledRow

NO_VISION = (
    "this model has no vision partition, so it takes no images: export a multimodal Gemma 3 checkpoint "
    "(4B and up) with the portable attention (the paged attention's kernel is causal only)"
)


class VisionEncoder:
    """One ONNX Runtime session over vision.onnx, and an LRU cache of image features by digest."""

    def __init__(
        self,
        model_dir: Path,
        record: VisionRecord,
        device: Device,
        num_threads: int | None = None,
        cache_size: int = 64,
        max_batch: int = 8,
    ) -> None:
        ort = onnxruntime()
        self.config = record.config
        self.placement = ImagePlacement(record.config)
        self.device = device
        self.cache_size = cache_size
        self.max_batch = max_batch
        path = str(Path(model_dir) / record.file)
        self.session = ort.InferenceSession(
            path, sess_options=session_options(num_threads, devices=[device]), providers=device.providers(False)
        )
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.num_encoded = 0  # images run through the tower (cache misses)

    def expand(self, text: str, tokenizer: Tokenizer) -> str:
        """`text` with each `<start_of_image>` as the image's tokens (wicore.types.images.ImagePlacement)."""
        return self.placement.expand(text, tokenizer)

    def spans(self, token_ids: Sequence[int], images: Sequence[ImageInput]) -> tuple[ImageSpan, ...]:
        """Where `images` go in a prompt (wicore.types.images.ImagePlacement)."""
        return self.placement.spans(token_ids, images)

    def features(self, images: Iterable[ImageInput]) -> dict[bytes, np.ndarray]:
        """[mm_tokens_per_image, hidden] float32 of each distinct image, by digest. Images not in
        the cache are encoded, up to `max_batch` in one run; the cache keeps the last `cache_size`."""
        wanted = {image.digest: image for image in images}
        out = {d: self._cache[d] for d in wanted if d in self._cache}
        missing = [image for d, image in wanted.items() if d not in out]
        for i in range(0, len(missing), self.max_batch):
            batch = missing[i : i + self.max_batch]
            pixels = np.stack([self.config.preprocessing.pixel_values(image.pixels) for image in batch])
            (encoded,) = self.session.run([io.IMAGE_FEATURES], {io.PIXEL_VALUES: pixels})
            self.num_encoded += len(batch)
            for image, value in zip(batch, encoded):
                out[image.digest] = value
        for digest in wanted:  # most recently used last
            self._cache[digest] = out[digest]
            self._cache.move_to_end(digest)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def decoder_inputs(
        self, rows: Sequence[ScheduledRow], seq_len: int, features: Mapping[bytes, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The decoder's image inputs for `rows` run as one [len(rows), seq_len] batch (padding at
        each row's end, at position 0, as wicore.executor.batch lays it out)."""
        until = np.ones((len(rows), seq_len), np.int64)  # padding: position 0, causal
        embeds: list[np.ndarray] = []
        indices: list[np.ndarray] = []
        for r, row in enumerate(rows):
            positions = np.arange(row.start, row.start + len(row.token_ids))
            until[r, : len(positions)] = positions + 1
            for span in row.images:
                inside = positions[(positions >= span.start) & (positions < span.stop)]
                until[r, inside - row.start] = span.stop
                embeds.append(features[span.image.digest][inside - span.start])
                indices.append(r * seq_len + inside - row.start)
        hidden = self.config.text_hidden_size
        return {
            io.IMAGE_EMBEDS: np.concatenate(embeds) if embeds else np.zeros((0, hidden), np.float32),
            io.IMAGE_TOKEN_INDICES: np.concatenate(indices) if indices else np.zeros(0, np.int64),
            io.ATTEND_UNTIL: until,
        }
