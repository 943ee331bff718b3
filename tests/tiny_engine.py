"""The engine settings the tiny-model tests share: one thread, 4-token blocks, a DEVICE-only pool.

Engine(tiny_config(model_dir, num_device_blocks=128, scheduler=SchedulerConfig(prefill_chunk=16)))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wicore.engine.config import EngineConfig

TINY_SETTINGS: dict[str, Any] = dict(num_threads=1, block_size=4, num_device_blocks=256, num_host_blocks=0, num_nvme_blocks=0)


def tiny_config(model_dir: Path, **overrides: Any) -> EngineConfig:
    """An EngineConfig for a tiny exported model; `overrides` replace TINY_SETTINGS' values."""
    return EngineConfig(model_dir=model_dir, **{**TINY_SETTINGS, **overrides})
