"""What `--model` names at serve/generate time: an exported folder, or a packaged or pulled
model (wicore.export.pull), a .gguf file, a Hugging Face folder or a Hugging Face Hub id
(wicore.export.hub), exported once into the user's cache and reused."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from wicore.errors import ManifestError
from wicore.export.hub import parse_hub_id
from wicore.export.pull import PULLABLE
from wicore.export.sources import PACKAGED
from wicore.graph.manifest import GRAPHS_REVISION, MANIFEST, Manifest

if TYPE_CHECKING:
    from wicore.devices.providers import Capability


def cache_dir() -> Path:
    base = os.environ.get("WICORE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "wicore")
    return Path(base) / "models"


def suited_export(capabilities: Sequence[Capability], source: str) -> tuple[str, str, str]:
    """(dtype, op flavour, attention) of the export of `source` that suits devices of these
    capabilities: where every one is a CPU that runs `ort-quant`, a GGUF's own quantized weights
    (2.7x the fp32 graphs' decode on the 270M; a pulled model's own CPU flavour, a float source's
    fp32: ort-quant would quantize it); fp16 where every one is an accelerator that runs fp16, with
    the paged attention where every one runs it in the portable flavour (2x the portable attention
    at batch 32 on an H100; WebGPU's paged graphs, slower there than its portable ones, are not picked), else
    in the op flavour they all list first (WebGPU's own: wicore/graph/fused_ops.py);
    else portable fp32."""
    if all(c.device_kind == "cpu" and "ort-quant" in c.op_flavours for c in capabilities):
        if source in PULLABLE:
            return "fp32", PULLABLE[source].cpu_op_flavour, "portable"
        hub = parse_hub_id(source)
        gguf = source in PACKAGED or source.lower().endswith(".gguf") or (hub is not None and hub.quant is not None)
        return "fp32", "ort-quant" if gguf else "portable", "portable"
    if all(c.device_kind != "cpu" and "fp16" in c.dtypes for c in capabilities):
        if all("paged" in c.attentions and "portable" in c.paged_op_flavours for c in capabilities):
            return "fp16", "portable", "paged"
        firsts = {c.op_flavours[0] for c in capabilities}
        return "fp16", firsts.pop() if len(firsts) == 1 else "portable", "portable"
    return "fp32", "portable", "portable"


def export_targets(devices: str) -> list[Capability]:
    """The capabilities of the devices an export is meant for (`cuda`, `cpu`, `cuda:0,cpu`): named,
    not looked up among the installed ones, so a CPU machine can export for a GPU."""
    from wicore.devices.providers import CAPABILITIES, DeviceError

    names = [spec.strip().partition(":")[0].lower() for spec in devices.split(",") if spec.strip()]
    unknown = [n for n in names if n not in CAPABILITIES]
    if unknown or not names:
        raise DeviceError(f"--for {devices!r}: name devices among {', '.join(CAPABILITIES)}")
    return [CAPABILITIES[n] for n in names]


def packaged_export(spec: str, devices: str = "cpu", is_installed: bool = True) -> tuple[str, str, str]:
    """`suited_export` of a packaged or pulled model for the devices of a --devices spec; `auto`
    stands for the device placement fills first: the first accelerator installed, or the CPU.
    `is_installed` False: devices this ONNX Runtime build lacks are named too (`wicore plan`)."""
    from wicore.devices.placement import device_list

    found = device_list(devices, is_installed)
    return suited_export([d.capability for d in (found[:1] if devices.strip() == "auto" else found)], spec)


def resolve_model(spec: str, devices: str = "cpu", is_installed: bool = True) -> Path:
    """The folder of an exported model. A packaged or pulled name, a .gguf file or a Hugging Face
    folder is exported on first use, in the flavour that suits `devices` (`packaged_export`),
    into a cache folder of its own, and reused after."""
    path = Path(spec)
    if (path / MANIFEST).is_file():
        return path
    hub = parse_hub_id(spec)
    if spec in PACKAGED or spec in PULLABLE:
        name = spec
    elif path.suffix.lower() == ".gguf" and path.is_file():
        name = f"{path.stem}-{source_key(path)}"
    elif (path / "config.json").is_file():
        name = f"{path.resolve().name}-{source_key(path)}"
    elif path.suffix.lower() == ".gguf":
        raise ManifestError(f"{spec}: no such GGUF file")
    elif hub is not None:
        name = f"hub/{hub.cache_name}"
    else:
        raise ManifestError(
            f"{spec}: no exported model here (no {MANIFEST}), nor a .gguf file, a Hugging Face folder (config.json) "
            f"or a Hub id (org/name); named models: {', '.join(sorted([*PACKAGED, *PULLABLE]))}"
        )
    dtype, flavour, attention = packaged_export(spec, devices, is_installed)
    kernels = cpu_kernels(flavour) if _on_the_cpu_ep(devices, is_installed) else "ort"
    target = cache_dir() / export_folder_name(name, dtype, flavour, attention, kernels)
    if not (target / MANIFEST).is_file() and kernels == "wicore" and not _builds_cpu_kernels():
        kernels = "ort"
        target = cache_dir() / export_folder_name(name, dtype, flavour, attention, kernels)
    stale = (target / MANIFEST).is_file() and _older_graphs(target)
    if stale or not (target / MANIFEST).is_file():
        from wicore.export.exporter import ExportConfig, export_model, stderr_progress
        from wicore.export.sources import open_source

        if stale:
            stderr_progress(f"exporting {spec} again into {target}: the cached export predates this WiCore's graphs")
        elif name != spec:
            stderr_progress(f"exporting {spec} once into {target} (later runs reuse it)")
        config = ExportConfig(dtype=dtype, op_flavour=flavour, attention=attention, kernels=kernels, overwrite=True)
        export_model(open_source(spec, progress=stderr_progress), target, config)
    return target


def _older_graphs(folder: Path) -> bool:
    """Whether a cached automatic export was written by an exporter of an older GRAPHS_REVISION (still
    readable, but what this WiCore exports now is better): resolve_model exports it again. A folder
    whose manifest does not parse is left to the loader, which names it."""
    try:
        return Manifest.read(folder).graphs_revision < GRAPHS_REVISION
    except ManifestError:
        return False


def export_folder_name(name: str, dtype: str, flavour: str, attention: str, kernels: str = "ort") -> str:
    """The cache folder of `name`'s export: what differs from the portable fp32 one, in its name."""
    parts = (flavour, dtype, attention, "wicore" if kernels == "wicore" else "portable")
    return name + "".join(f"-{part}" for part in parts if part not in ("portable", "fp32"))


def cpu_kernels(flavour: str, cpu_flags: frozenset[str] | None = None, has_compiler: bool | None = None) -> str:
    """`kernels` of an export the CPU runs: "wicore" (WiCore's MatMulQ, llama.cpp's int8 arithmetic)
    for the GGUF-quantized `ort-quant` graphs on a CPU with AVX-512 VNNI or AVX2 + FMA and a C++ compiler
    to build it; else "ort". On VNNI: 1.8x / 1.5x / 1.1x the CPU time of ONNX Runtime's MatMulNBits at
    1 / 8 / 16 SmolLM2 rows, 1.4-1.5x llama.cpp's decode; on an AVX2-only AMD EPYC (its AVX2 decode rows)
    SmolLM2-135M's decode step 2.1x and Gemma 3 270M's 1.7x shorter than on MatMulNBits, its 512-token prompts
    1.02x and 1.5x MLAS's speed (MatMulQ's float GEMM on AVX2; docs/PERFORMANCE.md, issue 37, 2026-11-30).
    Without AVX2 MatMulQ runs its scalar code: "ort".
    WICORE_CPU_KERNELS=ort keeps ONNX Runtime's everywhere."""
    if flavour != "ort-quant" or os.environ.get(CPU_KERNELS_ENV, "").lower() == "ort":
        return "ort"
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    if not ({"avx512_vnni", "avx512vl"} <= flags or {"avx2", "fma"} <= flags):
        return "ort"  # MatMulQ's scalar path: not measured against MLAS, surely slower
    if has_compiler is None:
        from wicore.kernels.library import find_compiler

        has_compiler = find_compiler(False) is not None
    return "wicore" if has_compiler else "ort"


CPU_KERNELS_ENV = "WICORE_CPU_KERNELS"


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (Linux); none where there is no /proc/cpuinfo."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def _on_the_cpu_ep(devices: str, is_installed: bool) -> bool:
    """Whether every device of the spec is ONNX Runtime's plain CPU EP (OpenVINO's CPU would pass
    MatMulQ's nodes back to it: not measured)."""
    from wicore.devices.placement import device_list

    return all(d.capability.name == "cpu" for d in device_list(devices, is_installed))


def _builds_cpu_kernels() -> bool:
    """Build WiCore's CPU kernel library now (cached), so that an export for it is one that loads; a
    failed build says so in one line and the export takes ONNX Runtime's kernels."""
    from wicore.export.exporter import stderr_progress
    from wicore.kernels.library import KernelBuildError, library

    try:
        library(False)
    except KernelBuildError as exc:
        stderr_progress(f"{exc}; exporting with ONNX Runtime's kernels instead")
        return False
    return True


def source_key(path: Path) -> str:
    """12 hex digits that change when the model source at `path` does: its absolute path and the
    size and modification time of the files an export reads (a GGUF; a folder's files)."""
    import hashlib

    path = path.resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    digest = hashlib.sha256(str(path).encode())
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:12]


@contextmanager
def cached_export_errors(spec: str, model_dir: Path) -> Iterator[None]:
    """Around loading `model_dir`, the folder `resolve_model` gave for `spec`: a damaged export in
    WiCore's cache (the user never exported it) says which folder to delete so that the next run
    exports it anew, instead of asking the user to re-export."""
    try:
        yield
    except ManifestError as exc:
        if Path(spec) == Path(model_dir) or cache_dir() not in Path(model_dir).parents:
            raise
        raise ManifestError(
            f"{exc} -- {model_dir} is WiCore's cached export of {spec}: delete that folder and run again to export it anew"
        ) from exc
