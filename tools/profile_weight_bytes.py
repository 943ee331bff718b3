"""The weight bytes a decode token reads, per tensor group: an export against the GGUF it came from.

A batch-1 decode step reads every weight of every matmul whole and one row of the embedding. For
the export, each node's initializers over --min-bytes count as read (a Gather's or
GatherBlockQuantized's table only by the rows it takes, so they are left out); nodes are grouped
by name with the layer numbers replaced by '#'. For the GGUF (llama.cpp's reads), tensors are
grouped by name the same way; `token_embd.weight` is the LM head where the GGUF has no
`output.weight` (tied), else it is only gathered and left out. Bits a weight: bytes x 8 / weights.

    PYTHONPATH=. python tools/profile_weight_bytes.py --model-dir DIR [--gguf PATH]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from wicore.graph.manifest import Manifest

ROW_READS = ("Gather", "GatherBlockQuantized")  # read a table's rows, not the table


@dataclass(frozen=True)
class Config:
    model_dir: Path
    gguf: Path | None
    min_bytes: int


def role(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def export_bytes(model_dir: Path, min_bytes: int) -> dict[str, int]:
    """{node role (op type appended): bytes of its initializers read a decode token}, each initializer once."""
    groups: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for partition in Manifest.read(model_dir).partitions:
        graph = onnx.load(model_dir / partition.file, load_external_data=False).graph
        sizes = {
            t.name: int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            for t in graph.initializer
        }
        for node in graph.node:
            if node.op_type in ROW_READS:
                continue
            for name in node.input:
                if name in sizes and sizes[name] >= min_bytes and name not in seen:
                    seen.add(name)
                    groups[f"{role(node.name.rsplit('/', 1)[0])} ({node.op_type})"] += sizes[name]
    return dict(groups)


def gguf_bytes(path: Path) -> dict[str, tuple[int, int, str]]:
    """{tensor role: (bytes, weights, the GGML types)} of the tensors a decode token reads whole."""
    from gguf import GGUFReader

    tensors = GGUFReader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    groups: dict[str, list] = defaultdict(lambda: [0, 0, set()])
    for t in tensors:
        if t.name == "token_embd.weight" and not tied:
            continue
        key = "token_embd.weight (tied head)" if t.name == "token_embd.weight" else role(t.name)
        groups[key][0] += int(t.n_bytes)
        groups[key][1] += int(t.n_elements)
        groups[key][2].add(t.tensor_type.name)
    return {k: (b, n, ",".join(sorted(types))) for k, (b, n, types) in groups.items()}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="an exported model")
    parser.add_argument("--gguf", type=Path, help="the GGUF it was exported from (llama.cpp's bytes)")
    parser.add_argument("--min-bytes", type=int, default=65536, help="smaller initializers are left out")
    args = parser.parse_args(argv)
    return Config(args.model_dir, args.gguf, args.min_bytes)


def run(config: Config) -> int:
    groups = export_bytes(config.model_dir, config.min_bytes)
    print(f"{config.model_dir}: weight bytes read a decode token\n\n| node group | MB |\n|---|---:|")
    for key, size in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {key} | {size / 1e6:.2f} |")
    print(f"| **total** | **{sum(groups.values()) / 1e6:.2f}** |")
    if config.gguf is not None:
        tensors = gguf_bytes(config.gguf)
        print(f"\n{config.gguf.name}: what llama.cpp reads a decode token\n")
        print("| tensor group | types | MB | bits a weight |\n|---|---|---:|---:|")
        for key, (size, count, types) in sorted(tensors.items(), key=lambda kv: -kv[1][0]):
            if size >= config.min_bytes:
                print(f"| {key} | {types} | {size / 1e6:.2f} | {8 * size / count:.2f} |")
        total = sum(size for size, _, _ in tensors.values())
        print(f"| **total** | | **{total / 1e6:.2f}** | |")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
