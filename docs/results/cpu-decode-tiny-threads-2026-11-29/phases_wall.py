import os, statistics, sys, time
from collections import defaultdict
from pathlib import Path
import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
acc = defaultdict(float)
def wrapc(cls, name, label):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; return r
    setattr(cls, name, w)
wrapc(C.InferenceSession, "run_with_iobinding", "ort")
wrapc(C.InferenceSession, "io_binding", "io_binding()")
for m in ("bind_cpu_input", "bind_output", "bind_ortvalue_input", "bind_ortvalue_output", "get_outputs"):
    wrapc(C.IOBinding, m, m)
wrapc(G.ModelGraphs, "bind_kv", "bind_kv(incl)")
wrapc(G.ModelGraphs, "run", "graphs.run")
wrapc(G.ModelGraphs, "_result_devices", "_result_devices")
G.graph_outputs = (lambda f: (lambda *a, **k: (lambda t: (f(*a, **k), acc.__setitem__("graph_outputs", acc["graph_outputs"] + 0)))(0)[0]))(G.graph_outputs)
model = Path(sys.argv[1]); n = 300
cfg = Config((str(model),), (1,), 128, int(os.environ.get("THREADS", "1")), n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
with Engine(engine_config(model, 1, cfg)) as engine:
    core = engine.core
    core.add(core.make_request(prompt, SamplingParams(max_tokens=n + 20, ignore_eos=True), "x"))
    for _ in range(5): core.step()
    acc.clear()
    t0 = time.perf_counter()
    for _ in range(n): core.step()
    total = time.perf_counter() - t0
print(f"step {1e3*total/n:.3f} ms; " + ", ".join(f"{k} {1e3*v/n:.4f}" for k, v in acc.items()))
