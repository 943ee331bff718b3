"""tools/step_timing.py times EngineCore.step() one call at a time: under async scheduling a call
launches step N+1 and returns step N's outputs, which the tool read as "no rows scheduled" (the
27B shape's bench_shapes failed so on an H200 on 2026-11-29, once async became the default where
CUDA graphs replay). Its engine must keep steps synchronous even where the default would not."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from step_timing import Config, decode_steps, engine_config

from wicore.engine.config import async_by_default
from wicore.engine.engine import Engine


def test_step_timing_engine_steps_synchronously_even_with_cuda_graphs(tiny_export) -> None:
    folder, _ = tiny_export(vocab_size=1100)  # the tool draws prompt ids from 1000 up
    config = Config((str(folder),), (2,), context=8, threads=1, num_steps=3, devices="cpu", profile=False, json_path=None)
    engine_cfg = engine_config(folder, 2, config)
    assert engine_cfg.async_scheduling is False
    assert async_by_default(engine_cfg, cuda_graphs_on_one_device=True) is False
    with Engine(engine_cfg) as engine:
        times = decode_steps(engine, 2, config)
    assert len(times.step_seconds) == 3
