"""The host part alone: ORT's run a no-op, N steps timed, then cProfile'd (host37)."""
import cProfile, os, pstats, sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np
from onnxruntime.capi import onnxruntime_inference_collection as C
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); n = 300; reps = 6
cfg = Config((str(model),), (1,), 128, 2, n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
with Engine(replace(engine_config(model, 1, cfg), steady_decode=os.environ.get("STEADY", "1") == "1")) as engine:
    core = engine.core
    real = C.InferenceSession.run_with_iobinding
    ts = []
    p = cProfile.Profile()
    for rep in range(reps):
        C.InferenceSession.run_with_iobinding = real
        core.add(core.make_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), f"x{rep}"))
        for _ in range(5): core.step()
        C.InferenceSession.run_with_iobinding = lambda *a, **k: None
        if rep % 2 == 0:
            for _ in range(n - 10):
                t = time.perf_counter(); core.step(); ts.append(time.perf_counter() - t)
        else:
            p.enable()
            for _ in range(n - 10): core.step()
            p.disable()
        core.run_to_end()
    print(f"host-only step med {1e6*np.median(ts):.1f} p10 {1e6*np.percentile(ts,10):.1f} us")
    pstats.Stats(p).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "40")))
