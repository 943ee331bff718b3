"""tools/bench_shapes.py --random-weights: quantized variants exported from random blocks with no
checkpoint (the 27B's full depth fits a device's disk that way); there are no floats behind them, so
float variants, the HF peers and --check are refused with one line each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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


def test_random_export_refuses_a_float_variant(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="paged is a float variant"):
        random_export("gemma3-1b", 1, "paged", tmp_path / "out")
    assert not (tmp_path / "out").exists()
