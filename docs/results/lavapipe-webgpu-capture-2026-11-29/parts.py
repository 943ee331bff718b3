import sys, time, collections
from pathlib import Path
import numpy as np
import wicore.executor.step_inputs as SI
import onnxruntime as ort
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
T = collections.defaultdict(float); N = collections.Counter()
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); T[name] += time.perf_counter() - t; N[name] += 1; return r
    return w
SI.StepInputs.sync = timed("sync", SI.StepInputs.sync)
ort.InferenceSession.run_with_iobinding = timed("run_with_iobinding", ort.InferenceSession.run_with_iobinding)
graphs = sys.argv[1] == "on"
cfg = EngineConfig(model_dir=Path("/work/cache-wgpu34/scratch/small-paged"), num_threads=1, devices="webgpu:0", host_tier_gb=0,
                   enable_prefix_cache=False, block_size=16, cuda_graphs=graphs)
rng = np.random.default_rng(0)
with Engine(cfg) as eng:
    eng.generate([rng.integers(5, 4000, 16).tolist()], SamplingParams(max_tokens=4, ignore_eos=True))
    T.clear(); N.clear()
    t = time.perf_counter()
    eng.generate([rng.integers(5, 4000, 16).tolist()], SamplingParams(max_tokens=21, ignore_eos=True))
    print(sys.argv[1], "total", round(time.perf_counter() - t, 2), {k: (N[k], round(v, 3)) for k, v in T.items()})
