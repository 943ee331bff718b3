"""What `--model` names at serve/generate time: an exported folder, or a packaged or pulled
model (wicore.export.pull) that is exported once into the user's cache and reused."""

from __future__ import annotations

import os
from pathlib import Path

from wicore.errors import ManifestError
from wicore.export.pull import PULLABLE
from wicore.export.sources import PACKAGED
from wicore.graph.manifest import MANIFEST


def cache_dir() -> Path:
    base = os.environ.get("WICORE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "wicore")
    return Path(base) / "models"


def packaged_export(devices: str = "cpu") -> tuple[str, str, str]:
    """(dtype, op flavour, attention) of the export of a packaged model that suits `devices`:
    `ort-quant` when every device is a CPU that runs it (the GGUF's own quantized weights: 2.7x
    the fp32 graphs' decode), fp16 when every device is an accelerator that runs fp16 (with the
    paged attention where every one runs it: 2x the portable one at batch 32 on an H100), else
    portable fp32. `auto` stands for the device placement fills first: the first accelerator
    installed, or the CPU."""
    from wicore.runtime.placement import device_list

    found = device_list(devices)
    caps = [d.capability for d in (found[:1] if devices.strip() == "auto" else found)]
    if all(c.device_kind == "cpu" and "ort-quant" in c.op_flavours for c in caps):
        return "fp32", "ort-quant", "portable"
    if all(c.device_kind != "cpu" and "fp16" in c.dtypes for c in caps):
        return "fp16", "portable", "paged" if all("paged" in c.attentions for c in caps) else "portable"
    return "fp32", "portable", "portable"


def resolve_model(spec: str, devices: str = "cpu") -> Path:
    """The folder of an exported model; a packaged name is exported on first use, in the
    flavour that suits `devices` (`packaged_export`), into its own cache folder."""
    path = Path(spec)
    if (path / MANIFEST).is_file():
        return path
    if spec in PACKAGED or spec in PULLABLE:
        dtype, flavour, attention = packaged_export(devices)
        if spec in PULLABLE:  # on a CPU, the pulled model's own flavour (SmolLM2: fp32; int8 activations drift)
            flavour = PULLABLE[spec].cpu_op_flavour if flavour == "ort-quant" else flavour
        suffix = "".join(f"-{part}" for part in (flavour, dtype, attention) if part not in ("portable", "fp32"))
        target = cache_dir() / f"{spec}{suffix}"
        if not (target / MANIFEST).is_file():
            from wicore.export.exporter import ExportConfig, export_model, stderr_progress
            from wicore.export.sources import open_source

            config = ExportConfig(dtype=dtype, op_flavour=flavour, attention=attention, overwrite=True)
            export_model(open_source(spec, progress=stderr_progress), target, config)
        return target
    if path.suffix == ".gguf" or (path / "config.json").is_file():
        raise ManifestError(f"{spec} is a model source, not an exported model: run wicore-export --model {spec} --out DIR first")
    raise ManifestError(
        f"{spec}: no exported model here (no {MANIFEST}); named models: {', '.join(sorted([*PACKAGED, *PULLABLE]))}"
    )
