"""Device memory an engine holds after each stage of its construction and after a long request,
with its KV pools made either way: through ONNX Runtime's Python binding (`OrtValue.ortvalue_from_numpy`,
WiCore's way before 2026-11-27) or through wicore.devices.device_alloc (a graph run, the sessions'
shared arena). Each way in a process of its own, one after the other, on an exported model:

    PYTHONPATH=/tmp/site:.:tools python3 tools/probe_engine_memory.py /tmp/m12 --context 130944

Memory is the card's used memory (cudaMemGetInfo) above what it was when the process first asked,
which made its CUDA context: the context is not in the numbers. The request is
long_runs.wicore_long's (a warm-up, then `--context` random tokens in chunks of 1,024 and
4 greedy steps, the whole pool on the device); the last stage is read once the engine has closed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import cuda_memory

WAYS = ("python-binding", "device_alloc")
GIB = 1 << 30


def used_gib() -> float:
    free, total = cuda_memory()
    return (total - free) / GIB


def probe(way: str, model_dir: Path, context: int) -> dict[str, Any]:
    from long_runs import Config, DeviceMemory, wicore_long

    from wicore.devices import device_alloc
    from wicore.devices.providers import onnxruntime
    from wicore.engine import engine
    from wicore.executor import graphs

    base, stages = used_gib(), []

    def mark(stage: str) -> None:
        stages.append((stage, round(used_gib() - base, 3)))

    if way == "python-binding":
        ort = onnxruntime()
        device_alloc.zeros = lambda device, shape, dtype: ort.OrtValue.ortvalue_from_numpy(  # type: ignore[assignment]
            np.zeros(shape, dtype), *device.ort_device
        )

    def after(owner: Any, name: str) -> None:
        inner = getattr(owner, name)

        def marked(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            mark(name)
            return result

        setattr(owner, name, marked)

    for name in ("KVBuffers", "ModelGraphs", "build_kv_cache"):
        after(engine, name)
    after(graphs.ModelGraphs, "enable_decode_graphs")
    config = Config(
        shape="", contexts=(context,), variants=(), prefill_chunk=1024, decode_steps=4, devices="cuda:0",
        work=model_dir, hf=False, json_path=None,
    )  # fmt: skip
    result = wicore_long(model_dir, context, config, None, DeviceMemory())
    mark("engine closed")
    result.pop("tokens", None)
    return {"stages": stages, **result}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path, help="an export with --attention paged")
    p.add_argument("--context", type=int, default=130944)
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)
    results = {}
    for way in WAYS:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results[way] = r = pool.submit(probe, way, a.model_dir, a.context).result()
        stages = ", ".join(f"{stage} {gib:.2f}" for stage, gib in r["stages"])
        print(
            f"{way}: {stages} GiB; KV {r['kv_gib']:.2f} GiB, weights {r['weights_gib']:.2f}, peak {r['peak_gib']:.2f}", flush=True
        )
    if a.json:
        a.json.write_text(json.dumps({"model_dir": str(a.model_dir), "context": a.context, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
