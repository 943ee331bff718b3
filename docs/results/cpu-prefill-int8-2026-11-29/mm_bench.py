import os, sys, time, glob
import numpy as np
sys.path.insert(0, "/work/wt-prompt37")
from tests.kernels.test_matmul_q import random_weight, session
os.environ["WICORE_CACHE"] = "/work/cache-prompt37/wicore-cache"
from wicore.kernels.library import library
lib = str(library(cuda=False))
rng = np.random.default_rng(0)
for (n, k, bits, bs, off) in [(640, 2048, 8, 32, False), (4096, 640, 4, 32, True), (640, 2048, 4, 32, True)]:
    w = random_weight(rng, n, k, bits, bs, off)
    x = rng.standard_normal((1, 256, k)).astype(np.float32)
    res = {}
    for mode in ["float", "int8", "float", "int8"]:
        if mode == "int8": os.environ["WICORE_MATMULQ_PROMPT"] = "int8"
        s = session(lib, w, residual=True, threads=1)
        os.environ.pop("WICORE_MATMULQ_PROMPT", None)
        s.run(None, {"x": x})
        ts = []
        for _ in range(5):
            t = time.thread_time(); s.run(None, {"x": x}); ts.append(time.thread_time() - t)
        res.setdefault(mode, []).append(min(ts) * 1e3)
    print(n, k, bits, bs, off, {m: [round(v, 2) for v in r] for m, r in res.items()}, f"GMAC/s float {256*n*k/min(res['float'])/1e6:.1f} int8 {256*n*k/min(res['int8'])/1e6:.1f}", flush=True)
