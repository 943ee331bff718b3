"""wicore/export/random_weights.py: the random sources the full-depth benchmark exports the 27B shape from.
The quantized one's float values are never made, so its export must equal one of the same blocks
with their dequantized floats behind them (nothing in the ort-quant export reads the floats)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from wicore.export import random_weights
from wicore.export.exporter import ExportConfig, export_model
from wicore.model.config import DecoderConfig
from wicore.model.quant import QuantizedTensor

TINY = {
    "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "sliding_window": 16, "max_position_embeddings": 4096, "query_pre_attn_scalar": 16,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
}  # fmt: skip


@pytest.fixture(scope="module")
def rw() -> ModuleType:
    return random_weights


def materialized(rw: ModuleType, config: DecoderConfig) -> object:
    """The random source with its blocks' floats behind each weight, as a GGUF source hands them over."""

    class Materialized(rw.RandomQuantSource):  # type: ignore[name-defined,misc]
        def linear(self, name: str, shape: tuple[int, int]) -> QuantizedTensor:
            blocks = self.blocks(name, shape)
            return QuantizedTensor(blocks.dequantize(), lambda: blocks)

    return Materialized(config)


def exported_bytes(source: object, out: Path, partitions: int) -> dict[str, bytes]:
    config = ExportConfig(dtype="fp16", op_flavour="ort-quant", weight_bits=4, quantize_embedding=True, num_partitions=partitions)
    export_model(source, out, config, progress=lambda _: None)  # type: ignore[arg-type]
    return {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.suffix in (".onnx", ".data")}


@pytest.mark.parametrize("bits", [4, 8])
def test_blocks_are_seeded_and_spread_like_hf_init(rw: ModuleType, bits: int) -> None:
    source = rw.RandomQuantSource(DecoderConfig.from_hf(TINY), bits)
    a = source.blocks("layers.0.mlp.up_proj", (256, 512))
    assert np.array_equal(a.codes, source.blocks("layers.0.mlp.up_proj", (256, 512)).codes)
    assert not np.array_equal(a.codes, source.blocks("layers.1.mlp.up_proj", (256, 512)).codes)
    qmax = (1 << (bits - 1)) - 1
    assert a.codes.min() == -qmax and a.codes.max() == qmax
    assert abs(a.codes.mean()) < 4 * a.codes.std() / np.sqrt(a.codes.size)  # centred: -8..7's -0.5 fails this
    assert abs(a.dequantize().std() - rw.INIT_STD) < 0.1 * rw.INIT_STD
    assert source.embedding() is source.embedding()  # the rows and the tied head: one set of codes


def test_export_never_reads_the_floats(rw: ModuleType, tmp_path: Path) -> None:
    config = DecoderConfig.from_hf(TINY)
    lazy = exported_bytes(rw.RandomQuantSource(config), tmp_path / "lazy", partitions=2)
    real = exported_bytes(materialized(rw, config), tmp_path / "real", partitions=2)
    assert lazy.keys() == real.keys() and {"embed_tokens.data"} < lazy.keys()
    assert all(lazy[name] == real[name] for name in lazy)


def test_float_source_exports_its_floats_in_fp16(rw: ModuleType, tmp_path: Path) -> None:
    source = rw.RandomFloatSource(DecoderConfig.from_hf(TINY))
    layer = source.layer(1)
    assert layer["mlp.up_proj"].dtype == np.float32 and np.array_equal(layer["mlp.up_proj"], source.layer(1)["mlp.up_proj"])
    assert abs(layer["mlp.up_proj"].std() - rw.INIT_STD) < 0.05 * rw.INIT_STD
    out = tmp_path / "fp16"
    export_model(source, out, ExportConfig(dtype="fp16"), progress=lambda _: None)
    (graph,) = out.glob("*.onnx")
    weights = {t.name: numpy_helper.to_array(t, str(out)) for t in onnx.load(str(graph)).graph.initializer}
    gate_up = np.concatenate([layer["mlp.gate_proj"], layer["mlp.up_proj"]]).T.astype(np.float16)
    assert np.array_equal(weights["/model/layers.1/mlp/gate_up_proj.weight"], gate_up)
