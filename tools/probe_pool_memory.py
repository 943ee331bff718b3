"""Device memory the KV pools take, made two ways: through ONNX Runtime's Python binding (its own
CUDA arena, regions growing to the next power of two) and through wicore.devices.device_alloc (a
graph run, the sessions' shared arena). Each way in a process of its own, pools in layer order at a
named shape's full depth, as KVBuffers makes them; no model needed.

    PYTHONPATH=/tmp/site:.:tools python3 tools/probe_pool_memory.py --shape gemma3-27b --context 130944
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from benchlib import cuda_memory

from wicore.model.config import DecoderConfig
from wicore.model.shapes import SHAPES, hf_config

GIB = 1 << 30
WAYS = ("python-binding", "device_alloc")


def pool_shapes(shape: str, context: int, block_size: int, window: int) -> list[tuple[int, ...]]:
    """Each layer's K (= V) pool shape, full layers holding `context` tokens, sliding ones `window`."""
    depth = int(SHAPES[shape]["depth"])  # type: ignore[call-overload]
    cfg = DecoderConfig.from_hf({"model_type": "gemma3_text", **hf_config(shape, depth)})
    full, sliding = -(-context // block_size) + 1, -(-window // block_size) + 2  # + the sink, + a straddle
    blocks = [sliding if cfg.is_sliding(i) else full for i in range(cfg.num_layers)]
    return [(n, block_size, cfg.num_kv_heads, cfg.head_dim) for n in blocks]


def used_bytes() -> int:
    free, total = cuda_memory()
    return total - free


def allocate(way: str, shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    from wicore.devices.device_alloc import zeros
    from wicore.devices.providers import onnxruntime, parse_device

    ort, device = onnxruntime(), parse_device("cuda:0")
    warm = (
        zeros(device, (1,), np.float16)
        if way == "device_alloc"
        else ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.float16), "cuda", 0)
    )
    before = used_bytes()  # the CUDA context and the first (tiny) allocation are not the pools'
    pools = []
    for shape in shapes:
        for _ in "kv":
            if way == "device_alloc":
                pools.append(zeros(device, shape, np.float16))
            else:
                pools.append(ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float16), "cuda", 0))
    asked = sum(int(np.prod(s)) * 2 * 2 for s in shapes)
    del warm
    return {"asked_gib": asked / GIB, "used_gib": (used_bytes() - before) / GIB}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gemma3-27b", choices=sorted(SHAPES))
    p.add_argument("--context", type=int, default=130944)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--window", type=int, default=2048, help="sliding layers: the window and a prefill chunk")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    shapes = pool_shapes(a.shape, a.context, a.block_size, a.window)
    results = {}
    for way in WAYS:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results[way] = pool.submit(allocate, way, shapes).result()
        r = results[way]
        print(f"{way:15s} asked {r['asked_gib']:.2f} GiB, took {r['used_gib']:.2f} GiB", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
