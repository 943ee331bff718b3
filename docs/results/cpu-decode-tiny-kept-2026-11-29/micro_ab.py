import os, sys, time
import numpy as np
sys.path.insert(0, "/work/wt-decode37/tests/kernels"); sys.path.insert(0, "/work/wt-decode37/tests")
import test_matmul_q as T
from wicore.kernels.library import library
libs = {"chunk64": "/root/.cache/wicore/kernels/4f085852e5bc5b87f45d/libwicore_kernels.so", "chunk128K": str(library(False))}
rng = np.random.default_rng(0)
n = int(os.environ.get("N", "49152"))
w = T.gguf_like(rng, "Q6_K", n, 256)
x = rng.normal(0, 1, (1, 1, 256)).astype(np.float32)
ss = {(name, th): T.session(p, w, residual=True, threads=th, narrow_widths=True, narrow_8bit_scales=True) for name, p in libs.items() for th in (1, 2)}
outs = [s.run(None, {"x": x})[0] for s in ss.values()]
assert all(np.array_equal(outs[0], o) for o in outs)
res = {k: [] for k in ss}
for _ in range(int(os.environ.get("R", "5"))):
    for k, s in ss.items():
        for _ in range(5): s.run(None, {"x": x})
        for _ in range(10):
            t = time.perf_counter()
            for _ in range(5): s.run(None, {"x": x})
            res[k].append((time.perf_counter() - t) / 5)
print(f"N={n} load {os.getloadavg()[0]:.2f} | " + " | ".join(f"{k[0]} {k[1]}T p10 {1e3*np.percentile(v, 10):.3f} med {1e3*np.median(v):.3f} ms" for k, v in res.items()))
