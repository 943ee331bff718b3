"""The tiny Q4_K_M head alone (49,152 x 256 Q6_K, residual on, narrow 8-bit scales): 6-bit codes (narrow_codes) against
8-bit codes (the export's head today, WIDE_HEAD_CODES), 1 and 2 threads, sessions interleaved in one process;
p10 / median of R x 10 timings of 5 runs, ms; the outputs' bits compared."""
import os, sys, time
import numpy as np
sys.path.insert(0, "/work/wt-small37/tests/kernels"); sys.path.insert(0, "/work/wt-small37/tests")
import test_matmul_q as T
from wicore.kernels.library import library
rng = np.random.default_rng(0)
n = int(os.environ.get("N", "49152")); k = int(os.environ.get("K", "256"))
w = T.gguf_like(rng, "Q6_K", n, k)
x = rng.normal(0, 1, (1, 1, k)).astype(np.float32)
p = str(library(False))
ss = {(codes, th): T.session(p, w, residual=codes != "8bit-int8", threads=th, narrow_widths=True, narrow_8bit_scales=True, narrow_codes=codes == "6bit")
      for codes in ("8bit", "8bit-int8") for th in (1, 2)}
outs = {kk: s.run(None, {"x": x})[0] for kk, s in ss.items()}
first = next(iter(outs.values()))
print("max |residual - int8| of the logits:", float(np.abs(outs[("8bit", 2)] - outs[("8bit-int8", 2)]).max()), "logits std", float(first.std()))
res = {kk: [] for kk in ss}
for r in range(int(os.environ.get("R", "6"))):
    for kk, s in (list(ss.items()) if r % 2 == 0 else list(ss.items())[::-1]):
        time.sleep(0.02)
        for _ in range(5): s.run(None, {"x": x})
        for _ in range(10):
            t = time.perf_counter()
            for _ in range(5): s.run(None, {"x": x})
            res[kk].append((time.perf_counter() - t) / 5)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} | " + " | ".join(f"{kk[0]} {kk[1]}T p10 {1e3*np.percentile(v, 10):.3f} med {1e3*np.median(v):.3f}" for kk, v in res.items()))
