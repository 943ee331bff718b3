"""Per-step wall time by phase (wrappers), steady on/off: MODEL, 300 steps, 2 threads (host37)."""
import os, sys, time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
import wicore.executor.graphs as G
import wicore.executor.runner as R
import wicore.engine.core as CO
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
acc = defaultdict(float)
def wrapc(cls, name, label):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; return r
    setattr(cls, name, w)
wrapc(C.InferenceSession, "run_with_iobinding", "ort")
wrapc(G.ModelGraphs, "run", "graphs.run")
wrapc(R.ModelRunner, "repeat", "repeat")
wrapc(R.ModelRunner, "prepare", "prepare")
wrapc(R.ModelRunner, "finish", "finish")
wrapc(CO.EngineCore, "_account", "account")
model = Path(sys.argv[1]); n = 300
cfg = Config((str(model),), (1,), 128, 2, n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
for steady in (True, False, True, False):
    with Engine(replace(engine_config(model, 1, cfg), steady_decode=steady)) as engine:
        core = engine.core
        core.add(core.make_request(prompt, SamplingParams(max_tokens=n + 20, ignore_eos=True), "x"))
        for _ in range(5): core.step()
        acc.clear()
        ts = []
        for _ in range(n):
            t = time.perf_counter(); core.step(); ts.append(time.perf_counter() - t)
        total = sum(ts)
    print(f"steady {steady} step {1e3*total/n:.3f} med {1e3*np.median(ts):.3f} ms; host {1e3*(total-acc['ort'])/n:.3f}; " + ", ".join(f"{k} {1e3*v/n:.4f}" for k, v in acc.items()))
