"""The host part alone at B rows: ORT's run a no-op, decode steps timed, steady on/off in turn (host37).
usage: hostprof_b.py MODEL B..."""
import sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model, batches = Path(sys.argv[1]), [int(b) for b in sys.argv[2:]]
real = C.InferenceSession.run_with_iobinding
n = 200
for b in batches:
    cfg = Config((str(model),), (b,), 64, 2, n + 20, "cpu", False, None)
    res = {}
    for steady in (True, False, True, False):
        C.InferenceSession.run_with_iobinding = real
        with Engine(replace(engine_config(model, b, cfg), steady_decode=steady)) as engine:
            core = engine.core
            rng = np.random.default_rng(b)
            for i in range(b):  # prompts of 64 - i tokens: the rows start blocks at different steps
                core.add(core.make_request(rng.integers(1000, 20000, 64 - i % 16).tolist(), SamplingParams(max_tokens=n, ignore_eos=True), f"r{i}"))
            while not (core.last_step.rows and len(core.last_step.rows) == b and all(len(r.token_ids) == 1 for r in core.last_step.rows)):
                core.step()
            C.InferenceSession.run_with_iobinding = lambda *a, **k: None
            ts, rep = [], 0
            for _ in range(n - 30):
                t = time.perf_counter(); core.step(); ts.append(time.perf_counter() - t); rep += core.last_step.repeated
            res.setdefault(steady, []).append((np.median(ts), np.percentile(ts, 10), rep / len(ts)))
    print(f"rows {b}: " + " | ".join(f"{'steady' if k else 'full'} med {1e6*min(v[0] for v in r):.1f} p10 {1e6*min(v[1] for v in r):.1f} us (repeated {r[0][2]:.2f})" for k, r in res.items()))
