"""The engine's host part with ONNX Runtime's run replaced (after warm-up) by: nothing (hot), or a pass over a 13.5 MB
array (the tiny Q4_K_M head's bytes: a NumPy sum, one thread) whose time is taken out: the host part's CPU time a step
with its caches as the head leaves them. 5 x 60 steps each, alternating; thread CPU time, us."""
import os, sys, time
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); n = 30
cfg = Config((str(model),), (1,), 128, 2, 12 * n + 40, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 64).tolist()
big = np.ones(13_500_000 // 8, np.float64)
spent = [0.0]
def stream(self, b, ro=None):
    t = time.thread_time(); big.sum(); spent[0] += time.thread_time() - t
with Engine(engine_config(model, 1, cfg)) as engine:
    core = engine.core
    core.add(core.make_request(prompt, SamplingParams(max_tokens=12 * n + 40, ignore_eos=True), "x"))
    for _ in range(5): core.step()
    res = {"hot": [], "after 13.5 MB": []}
    for r in range(6):
        for kind in res:
            C.InferenceSession.run_with_iobinding = (lambda self, b, ro=None: None) if kind == "hot" else stream
            spent[0] = 0.0
            t = time.thread_time()
            for _ in range(n): core.step()
            res[kind].append((time.thread_time() - t - spent[0]) / n)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} host part a step, us (min / median of 6 x {n} steps): " + " | ".join(f"{k} {1e6*min(v):.1f} / {1e6*sorted(v)[3]:.1f}" for k, v in res.items()))
