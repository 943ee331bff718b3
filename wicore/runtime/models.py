"""What `--model` names at serve/generate time: an exported folder, or a packaged model
that is exported once into the user's cache and reused."""

from __future__ import annotations

import os
from pathlib import Path

from wicore.errors import ManifestError
from wicore.export.sources import PACKAGED
from wicore.graph.manifest import MANIFEST

DEFAULT_MODEL = "gemma3-270m"


def cache_dir() -> Path:
    base = os.environ.get("WICORE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "wicore")
    return Path(base) / "models"


def resolve_model(spec: str) -> Path:
    """The folder of an exported model; a packaged name is exported on first use."""
    path = Path(spec)
    if (path / MANIFEST).is_file():
        return path
    if spec in PACKAGED:
        target = cache_dir() / spec
        if not (target / MANIFEST).is_file():
            from wicore.export.exporter import ExportConfig, export_model
            from wicore.export.sources import open_source

            export_model(open_source(spec), target, ExportConfig(overwrite=True))
        return target
    if path.suffix == ".gguf" or (path / "config.json").is_file():
        raise ManifestError(f"{spec} is a model source, not an exported model: run wicore-export --model {spec} --out DIR first")
    raise ManifestError(f"{spec}: no exported model here (no {MANIFEST}); packaged names: {', '.join(sorted(PACKAGED))}")
