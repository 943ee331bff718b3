"""Ad-hoc: N steady decode steps of MODEL at 2 threads (for perf record); prints the median step."""
import sys, time
from pathlib import Path
import numpy as np
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
import wicore.executor.graphs as G
model, n = Path(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3: G.kernel_library = lambda devices, lib=sys.argv[3]: Path(lib)
cfg = Config((str(model),), (1,), 128, 2, n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
cfg = Config((str(model),), (1,), 128, int(__import__("os").environ.get("THREADS", "2")), 370, "cpu", False, None)
ts = []
with Engine(engine_config(model, 1, cfg)) as engine:
    core = engine.core
    for i in range(n // 350):
        core.add(core.make_request(prompt, SamplingParams(max_tokens=360, ignore_eos=True), f"x{i}"))
        for _ in range(5): core.step()
        for _ in range(350):
            t = time.perf_counter(); core.step(); ts.append(time.perf_counter() - t)
        while core.has_unfinished() if hasattr(core, "has_unfinished") else False: core.step()
        for _ in range(10): core.step()
print(f"median {1e3*np.median(ts):.3f} ms p10 {1e3*np.percentile(ts,10):.3f}")
