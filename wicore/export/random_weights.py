"""Random 4- or 8-bit weights at a named Gemma 3 shape, made a layer at a time: a weight source for
WiCore's exporter with no checkpoint behind it (and `RandomFloatSource`, float ones, for fp16).

A device machine's disk (64 GiB) holds the 27B's int4 export (14 GiB) but not the bf16 checkpoint
it would be quantized from (54 GB) beside it; and quantizing 27B floats costs minutes. This source
hands the exporter `QuantizedTensor`s whose blocks are random codes and scales, drawn from a seed
per tensor, so the `ort-quant` flavour writes them as they are (as it does a GGUF's Q4_0 blocks).
Their float values are never read there and are not made: a zero-strided array of the right shape
stands behind each. A float export of this source would be all zeros, so it only serves `ort-quant`
(tests/export/test_random_weights.py checks the export equals one from the dequantized floats).

Scales are chosen so a weight's spread is HF's initializer's (std 0.02); norm weights are small
random floats around Gemma's `1 + w`.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from wicore.model.config import DecoderConfig
from wicore.model.quant import BlockQuant, QuantizedTensor
from wicore.model.shapes import SHAPES, hf_config
from wicore.model.weights import LayerWeights, expected_shapes

INIT_STD = 0.02  # HF's initializer_range for Gemma 3


class RandomQuantSource:
    """The WeightSource protocol (wicore.model.weights) over random `bits`-bit blocks."""

    def __init__(self, config: DecoderConfig, bits: int = 4, block_size: int = 32, seed: int = 0) -> None:
        self.config = config
        self.bits, self.block_size, self.seed = bits, block_size, seed
        self._embedding: np.ndarray | None = None

    @classmethod
    def of_shape(cls, shape: str, bits: int = 4, layers: int | None = None, seed: int = 0) -> RandomQuantSource:
        """`shape` of tools/bench_shapes.py's SHAPES at its full depth (or its first `layers`)."""
        depth = int(SHAPES[shape]["depth"]) if layers is None else layers
        return cls(DecoderConfig.from_hf({"model_type": "gemma3_text", **hf_config(shape, depth)}), bits, seed=seed)

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def blocks(self, name: str, shape: tuple[int, int]) -> BlockQuant:
        """Codes uniform over -qmax .. qmax (quantize_symmetric's range: a mean of zero, where the
        full signed range's -0.5 gives every weight one common direction and the model one output
        token); scales around INIT_STD / the codes' spread."""
        rng = self._rng(name)
        rows, cols = shape
        qmax = (1 << (self.bits - 1)) - 1
        codes = rng.integers(-qmax, qmax + 1, (rows, cols), dtype=np.int8)
        spread = np.sqrt(((2 * qmax + 1) ** 2 - 1) / 12)  # a uniform code's standard deviation
        scales = (rng.random((rows, cols // self.block_size), dtype=np.float32) + 0.5) * np.float32(INIT_STD / spread)
        return BlockQuant(codes, scales, None, self.bits, self.block_size)

    def linear(self, name: str, shape: tuple[int, int]) -> QuantizedTensor:
        """A weight of `shape` that is its blocks only (see the module doc)."""
        return QuantizedTensor(np.broadcast_to(np.float32(0), shape), partial(self.blocks, name, shape))

    def describe(self) -> dict[str, Any]:
        return {"kind": "random", "bits": self.bits, "block_size": self.block_size, "seed": self.seed}

    def embedding(self) -> np.ndarray:
        if self._embedding is None:  # the first partition's rows and the last one's tied head
            shape = (self.config.vocab_size, self.config.hidden_size)
            self._embedding = self.linear("embed_tokens", shape)
        return self._embedding

    def final_norm(self) -> np.ndarray:
        return self._rng("norm").normal(0, INIT_STD, self.config.hidden_size).astype(np.float32)

    def lm_head(self) -> np.ndarray | None:
        return None  # tied: the embedding is the head

    def layer(self, index: int) -> LayerWeights:
        """The layer's weights, its matrices made in threads (NumPy's generators release the GIL: the
        27B's 0.4 G floats a layer are most of a float export's time on one core)."""
        shapes = expected_shapes(self.config)
        matrices = {name: (shape[0], shape[1]) for name, shape in shapes.items() if len(shape) == 2}
        with ThreadPoolExecutor(len(matrices)) as pool:
            made = dict(zip(matrices, pool.map(lambda name: self.linear(f"layers.{index}.{name}", matrices[name]), matrices)))
        tensors = {
            name: made[name]
            if name in made
            else self._rng(f"layers.{index}.{name}").normal(0, INIT_STD, shape).astype(np.float32)
            for name, shape in shapes.items()
        }
        return LayerWeights(index, tensors)

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        return None  # token ids only: benchmarks draw prompts from the vocabulary

    def vision(self) -> None:
        return None

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        return {}


class RandomFloatSource(RandomQuantSource):
    """Float weights (uniform, std INIT_STD) for a float export (fp16 graphs): what the quantized
    source's blocks stand in for, made in full since a float export reads them. Uniform rather than
    normal: NumPy draws it ~4x faster, and the 27B's 27 G floats are most of its export's time."""

    def linear(self, name: str, shape: tuple[int, int]) -> np.ndarray:  # type: ignore[override]
        weight = self._rng(name).random(shape, dtype=np.float32)
        weight -= np.float32(0.5)
        weight *= np.float32(INIT_STD * 12**0.5)  # uniform on [-a, a] has std a / sqrt(3)
        return weight

    def describe(self) -> dict[str, Any]:
        return {"kind": "random", "bits": 32, "seed": self.seed, "distribution": "uniform"}
