import time, numpy as np, statistics
from wicore.kernels.library import library
from tests.kernels.test_matmul_q import session, random_weight
lib = str(library(False))
rng = np.random.default_rng(0)
for (n, k) in [(1536, 576), (576, 1536)]:
    w = random_weight(rng, n, k, 4, 32, True)
    for m in (31, 32, 512):
        x = rng.standard_normal((1, m, k)).astype(np.float32)
        s = session(lib, w, "fast", residual=True, threads=2)
        s.run(None, {"x": x})
        ts = []
        for _ in range(7):
            t = time.perf_counter(); s.run(None, {"x": x}); ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        print(f"n {n} k {k} m {m}: {med*1e3:.2f} ms, {2*m*n*k/med/1e9:.1f} GFLOP/s, {med/m*1e6:.1f} us a row")
