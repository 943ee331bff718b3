"""Per-step wall time by phase (wrappers, no profiler): llama Q4_K_M engine, THREADS threads, 300 steps."""
import os, sys, time
from collections import defaultdict
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
import wicore.executor.graphs as G
import wicore.executor.runner as R
import wicore.engine.core as CO
import wicore.engine.scheduler as S
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
acc = defaultdict(float)
def wrapc(cls, name, label):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.thread_time(); r = f(*a, **k); acc[label] += time.thread_time() - t; return r
    setattr(cls, name, w)
wrapc(C.InferenceSession, "run_with_iobinding", "ort")
wrapc(G.ModelGraphs, "run", "graphs.run")
wrapc(R.ModelRunner, "prepare", "prepare")
wrapc(R.ModelRunner, "finish", "finish")
wrapc(S.Scheduler, "schedule", "schedule")
wrapc(CO.EngineCore, "_account", "account")
wrapc(CO.EngineCore, "_trace", "trace")
model = Path(sys.argv[1]); n = 300
cfg = Config((str(model),), (1,), 128, int(os.environ.get("THREADS", "2")), n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
with Engine(engine_config(model, 1, cfg)) as engine:
    core = engine.core
    core.add(core.make_request(prompt, SamplingParams(max_tokens=n + 20, ignore_eos=True), "x"))
    for _ in range(5): core.step()
    acc.clear()
    ts = []
    for _ in range(n):
        t = time.thread_time(); core.step(); ts.append(time.thread_time() - t)
    total = sum(ts)
acc["host"] = total - acc["ort"]
print(f"cpu: step {1e3*total/n:.3f} med {1e3*np.median(ts):.3f} ms; " + ", ".join(f"{k} {1e3*v/n:.4f}" for k, v in acc.items()))
