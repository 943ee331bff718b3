"""The tiny Q4_K_M head alone (one MatMulQ node, 49,152 x 256 Q6_K as 8-bit codes, narrow scales, residual on),
libraries LIB=name:path,... at 1 and 2 intra-op threads, interleaved; p10 / median of R x 10 timings of 5 runs."""
import os, sys, time
import numpy as np
sys.path.insert(0, "/work/wt-small37/tests/kernels"); sys.path.insert(0, "/work/wt-small37/tests")
import test_matmul_q as T
from wicore.kernels.library import library
libs = dict(s.split("=", 1) for s in os.environ["LIBS"].split(",")) if os.environ.get("LIBS") else {"cur": str(library(False))}
rng = np.random.default_rng(0)
n = int(os.environ.get("N", "49152")); k = int(os.environ.get("K", "256"))
w = T.gguf_like(rng, os.environ.get("KIND", "Q6_K"), n, k)
x = rng.normal(0, 1, (1, 1, k)).astype(np.float32)
ths = [int(t) for t in os.environ.get("THS", "1,2").split(",")]
ss = {(name, th): T.session(p, w, residual=True, threads=th, narrow_widths=True, narrow_8bit_scales=True, narrow_codes=os.environ.get("NARROW_CODES", "1") == "1") for name, p in libs.items() for th in ths}
outs = {kk: s.run(None, {"x": x})[0] for kk, s in ss.items()}
first = next(iter(outs.values()))
print("same bits:", all(np.array_equal(first, o) for o in outs.values()))
res = {kk: [] for kk in ss}
for _ in range(int(os.environ.get("R", "5"))):
    for kk, s in ss.items():
        for _ in range(5): s.run(None, {"x": x})
        for _ in range(10):
            t = time.perf_counter()
            for _ in range(5): s.run(None, {"x": x})
            res[kk].append((time.perf_counter() - t) / 5)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} N={n} load {os.getloadavg()[0]:.2f} | " + " | ".join(f"{kk[0]} {kk[1]}T p10 {1e3*np.percentile(v, 10):.3f} med {1e3*np.median(v):.3f} ms" for kk, v in res.items()))
