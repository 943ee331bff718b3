"""parts.py's engine with capture on, but the buckets run with gpu_graph_id -1 (no capture, no replay): the bucket path alone."""
import sys, time, collections
from pathlib import Path
import numpy as np
import onnxruntime as ort
import wicore.executor.cuda_graphs as CG
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
mode = sys.argv[1]
if mode == "bucket-uncaptured":
    orig = CG.DecodeGraphs._stages
    def stages(self, bucket):
        saved = bucket.graph_id; bucket.graph_id = -1
        try: return orig(self, bucket)
        finally: bucket.graph_id = saved
    CG.DecodeGraphs._stages = stages
cfg = EngineConfig(model_dir=Path("/work/cache-wgpu34/scratch/small-paged"), num_threads=1, devices="webgpu:0", host_tier_gb=0,
                   enable_prefix_cache=False, block_size=16, cuda_graphs=mode != "off")
rng = np.random.default_rng(0)
with Engine(cfg) as eng:
    eng.generate([rng.integers(5, 4000, 16).tolist()], SamplingParams(max_tokens=4, ignore_eos=True))
    t = time.perf_counter()
    r = eng.generate([rng.integers(5, 4000, 16).tolist()], SamplingParams(max_tokens=21, ignore_eos=True))
    print(mode, "total", round(time.perf_counter() - t, 2), r[0].token_ids[:6])
