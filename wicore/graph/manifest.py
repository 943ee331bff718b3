"""wicore.json: what an exported model folder holds, and the check that it is intact.

{
  "format": "wicore", "export_version": 1, "graphs_revision": 2,
  "source": {...}, "config": {...DecoderConfig...},
  "dtype": "fp32", "op_flavour": "portable", "attention": "portable", "opset": 17,
  "kv": {"layout": [...], "dtype": "float32" | "float16" | "int8" (graph/kv_quant.py), "sink_block": 0},
  "partitions": [{"file": "part-00.onnx", "layers": [0, 6], "inputs": [...], "outputs": [...]}, ...],
  "tokenizer": {...} | null,
  "vision": {"file": "vision.onnx", "inputs": [...], "outputs": [...], "config": {...VisionConfig,
             preprocessing included...}, "flavour": "portable" | "fused"} | null,
  "files": {"part-00.onnx": "<sha256>", "part-00.onnx.data": "<sha256>", ...}
}
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wicore.errors import ManifestError
from wicore.graph.kv_quant import kv_row_width
from wicore.model.config import DecoderConfig
from wicore.model.vision import VisionConfig

MANIFEST = "wicore.json"
EXPORT_VERSION = 1  # what this WiCore can read: another version is refused
# What the exporter writes, within a version any WiCore of it reads: raised when exports made before
# are still valid but now come out better, so that a cache of automatic exports (wicore.cli.models)
# makes its folders again. 1: no field; 2: MatMulQ's prompt precision per tensor (int8 prompts on
# Gemma 3's CPU layers, 2026-11-29).
GRAPHS_REVISION = 2


@dataclass(frozen=True)
class PartitionRecord:
    file: str
    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def has_embedding(self) -> bool:
        return "input_ids" in self.inputs

    @property
    def has_lm_head(self) -> bool:
        return "logits" in self.outputs

    @property
    def has_attention_stats(self) -> bool:
        return "attention_mass" in self.outputs

    @property
    def has_sampling_head(self) -> bool:
        return "sampled_tokens" in self.outputs

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "layers": [self.start, self.stop], "inputs": list(self.inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionRecord:
        start, stop = d["layers"]
        return cls(d["file"], start, stop, tuple(d["inputs"]), tuple(d["outputs"]))


@dataclass(frozen=True)
class VisionRecord:
    """The vision partition (graph/vision.py): its file, IO names, the tower's config, and its
    flavour ("portable": standard ops; "fused": com.microsoft.MultiHeadAttention and FastGelu)."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    config: VisionConfig
    flavour: str = "portable"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "config": self.config.to_dict(),
            "flavour": self.flavour,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VisionRecord:
        config = VisionConfig.from_dict(d["config"])
        return cls(d["file"], tuple(d["inputs"]), tuple(d["outputs"]), config, d.get("flavour", "portable"))


@dataclass(frozen=True)
class Manifest:
    source: dict[str, Any]
    config: DecoderConfig
    dtype: str
    op_flavour: str
    opset: int
    partitions: tuple[PartitionRecord, ...]
    tokenizer: dict[str, Any] | None
    files: dict[str, str]  # file name -> sha256
    attention: str = "portable"  # or "paged": com.microsoft.PagedAttention (graph/paged_attention.py)
    vision: VisionRecord | None = None  # a multimodal export's vision partition
    kv_cache_dtype: str = "auto"  # or "int8": KV blocks in 8 bits (graph/kv_quant.py)
    # The sampling head (graph/sampling.py) runs as its own graph after the last partition, built
    # at load; an older export may hold it in its last partition instead (PartitionRecord).
    sampling_head: bool = False
    kernels: str = "ort"  # "wicore": some nodes are WiCore's own ops (wicore/kernels), whose library the runtime loads
    graphs_revision: int = GRAPHS_REVISION  # the exporter's GRAPHS_REVISION when it wrote the folder (1 before the field)

    @property
    def has_sampling_head(self) -> bool:
        """Whether sampled rows are drawn on the device: by the separate head, or an older export's inline one."""
        return self.sampling_head or self.partitions[-1].has_sampling_head

    @property
    def has_attention_stats(self) -> bool:
        return all(p.has_attention_stats for p in self.partitions)

    @property
    def kv_dtype(self) -> str:
        """The KV pools' element type."""
        return "int8" if self.kv_cache_dtype == "int8" else {"fp32": "float32", "fp16": "float16"}[self.dtype]

    @property
    def kv_width(self) -> int:
        """Elements of one token's K (or V) of one head in the pools (int8: its exponents too)."""
        return kv_row_width(self.config.head_dim, self.kv_dtype)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "wicore",
            "export_version": EXPORT_VERSION,
            "graphs_revision": self.graphs_revision,
            "source": self.source,
            "config": self.config.to_dict(),
            "dtype": self.dtype,
            "op_flavour": self.op_flavour,
            "attention": self.attention,
            "opset": self.opset,
            "kv": {
                "layout": [
                    "num_blocks",
                    "block_size",
                    "num_kv_heads",
                    "head_dim + head_dim / 32" if self.kv_dtype == "int8" else "head_dim",
                ],
                "dtype": self.kv_dtype,
                "sink_block": 0,
            },
            "partitions": [p.to_dict() for p in self.partitions],
            "tokenizer": self.tokenizer,
            "vision": None if self.vision is None else self.vision.to_dict(),
            "sampling_head": self.sampling_head,
            "kernels": self.kernels,
            "files": self.files,
        }

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """Parse wicore.json; raise ManifestError if it is missing, malformed or of another version."""
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise ManifestError(f"{folder} is not an exported WiCore model (no {MANIFEST}); create one with wicore-export")
        try:
            d = json.loads(path.read_text())
            if d.get("format") != "wicore":
                raise ManifestError(f"{path}: not a WiCore manifest")
            if d.get("export_version") != EXPORT_VERSION:
                raise ManifestError(
                    f"{path}: export version {d.get('export_version')}, this WiCore reads {EXPORT_VERSION}; re-export the model"
                )
            return cls(
                source=d["source"],
                config=DecoderConfig.from_dict(d["config"]),
                dtype=d["dtype"],
                op_flavour=d["op_flavour"],
                opset=d["opset"],
                partitions=tuple(PartitionRecord.from_dict(p) for p in d["partitions"]),
                tokenizer=d.get("tokenizer"),
                files=dict(d["files"]),
                attention=d.get("attention", "portable"),
                vision=VisionRecord.from_dict(d["vision"]) if d.get("vision") else None,
                kv_cache_dtype="int8" if d["kv"]["dtype"] == "int8" else "auto",
                sampling_head=bool(d.get("sampling_head", False)),
                kernels=d.get("kernels", "ort"),
                graphs_revision=int(d.get("graphs_revision", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{path} is malformed ({exc!r}); re-export the model") from exc

    def verify(self, folder: Path) -> None:
        """Check that every listed file exists with its recorded sha256.

        A file is hashed again only where it changed since it last passed (its size, times or inode
        differ from the stamp kept in `VERIFIED`, as git's index spots a changed file): an unchanged
        27B export starts without reading its 54 GB. A folder that cannot be written to is hashed
        every time."""
        folder = Path(folder)
        for name in self.files:
            if not (folder / name).is_file():
                raise ManifestError(f"{folder}: {name} is missing; the export is incomplete, re-export the model")
        passed = _read_stamps(folder)
        stamps = {name: _stamp(folder / name, expected) for name, expected in self.files.items()}
        todo = [name for name in self.files if passed.get(name) != stamps[name]]
        with ThreadPoolExecutor(max_workers=4) as pool:
            digests = dict(zip(todo, pool.map(lambda n: sha256_file(folder / n), todo)))
        for name in todo:
            if digests[name] != self.files[name]:
                raise ManifestError(
                    f"{folder}: {name} does not match its sha256 in {MANIFEST} (modified or truncated); re-export the model"
                )
        if todo:
            _write_stamps(folder, stamps)


VERIFIED = ".wicore-verified.json"  # beside wicore.json: the files as they were when their hashes last matched


def _stamp(path: Path, sha256: str) -> list[Any]:
    st = path.stat()
    return [sha256, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read_stamps(folder: Path) -> dict[str, Any]:
    try:
        stamps = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def _write_stamps(folder: Path, stamps: dict[str, list[Any]]) -> None:
    staged = folder / f"{VERIFIED}.{os.getpid()}"
    try:
        staged.write_text(json.dumps(stamps))
        staged.replace(folder / VERIFIED)  # whole or not at all, whoever else verifies at once
    except OSError:  # a read-only export: it is hashed at each start
        staged.unlink(missing_ok=True)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
