"""The engine's host part of a decode step alone: ONNX Runtime's run replaced by a no-op after warm-up (the
greedy token stays the last one), N steps, per-step CPU time of the thread; min of 5 repeats of the mean."""
import os, sys, time
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); n = 60
cfg = Config((str(model),), (1,), 128, 2, 5 * n + 40, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
with Engine(engine_config(model, 1, cfg)) as engine:
    core = engine.core
    core.add(core.make_request(prompt, SamplingParams(max_tokens=5 * n + 40, ignore_eos=True), "x"))
    for _ in range(5): core.step()
    C.InferenceSession.run_with_iobinding = lambda self, b, ro=None: None
    res = []
    for r in range(5):
        t = time.thread_time()
        for _ in range(n): core.step()
        res.append((time.thread_time() - t) / n)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} host a step: min {1e6*min(res):.1f} us, median {1e6*sorted(res)[2]:.1f} us")
