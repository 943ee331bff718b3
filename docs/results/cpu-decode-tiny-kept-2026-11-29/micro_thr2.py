import sys, time
import numpy as np
sys.path.insert(0, "/work/wt-decode37/tests/kernels"); sys.path.insert(0, "/work/wt-decode37/tests")
import test_matmul_q as T
from wicore.kernels.library import library
lib = str(library(False))
rng = np.random.default_rng(0)
import os; w = T.gguf_like(rng, "Q6_K", int(os.environ.get("N", "49152")), 256)
x = rng.normal(0, 1, (1, 1, 256)).astype(np.float32)
ss = {th: T.session(lib, w, residual=True, threads=th, narrow_widths=True, narrow_8bit_scales=True) for th in (1, 2)}
for _ in range(3):
    for th, s in ss.items():
        for _ in range(20): s.run(None, {"x": x})
        v = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(20): s.run(None, {"x": x})
            v.append((time.perf_counter() - t) / 20)
        print(f"threads {th}: min {1e3*min(v):.3f} median {1e3*np.median(v):.3f} ms", flush=True)
