"""tools/bench_shapes.py --random-weights: exports from random weights with no checkpoint (the 27B's
full depth fits a device's disk that way): quantized variants from random blocks, float ones from
random floats; there is no checkpoint to run, so the HF peers and --check are refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from wicore.export.random_weights import INIT_STD

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from bench_shapes import parse_args
from shape_exports import random_export


def test_random_weights_parses_for_quantized_variants() -> None:
    config = parse_args(
        ["--layers", "62", "--variants", "int4-paged+graphs,int4-paged-q16+graphs", "--no-hf", "--random-weights"]
    )
    assert config.random_weights and config.layers == (62,)
    assert config.variants == ("int4-paged+graphs", "int4-paged-q16+graphs")


@pytest.mark.parametrize("extra", [[], ["--no-hf", "--check"], ["--no-hf", "--hf-compiled"]])
def test_random_weights_refuses_a_float_peer_or_check(extra: list[str]) -> None:
    with pytest.raises(SystemExit, match="--random-weights has no float checkpoint"):
        parse_args(["--variants", "int4-paged", "--random-weights", *extra])


@pytest.mark.slow  # 1.2 GB of embedding floats
def test_random_export_makes_a_float_variant_from_random_floats(tmp_path: Path) -> None:
    """A float variant with no checkpoint: fp16 weights of the shape, uniform with the source's std."""
    out = random_export("gemma3-1b", 1, "paged", tmp_path / "out")
    manifest = json.loads((out / "wicore.json").read_text())
    assert (manifest["dtype"], manifest["config"]["num_layers"], manifest["source"]["kind"]) == ("fp16", 1, "random")
    (graph,) = out.glob("*.onnx")
    weights = {t.name: t for t in onnx.load(str(graph), load_external_data=False).graph.initializer}
    qkv = weights["/model/layers.0/attn/qkv_proj.weight"]  # 4 query heads and 2 x 1 KV head of 256
    assert (qkv.data_type, list(qkv.dims)) == (onnx.TensorProto.FLOAT16, [1152, 6 * 256])
    values = numpy_helper.to_array(qkv, str(out))
    assert abs(float(values.astype(np.float32).std()) - INIT_STD) < 0.01 * INIT_STD
    assert float(np.abs(values).max()) <= INIT_STD * 3**0.5 * 1.001  # uniform on [-a, a], a = sqrt(3) std
