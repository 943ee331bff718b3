"""Ad-hoc (issue 37, 2026-11-30): a prompt's prefill (one request of LEN random tokens, one token asked: its time to
the first token in the engine) for exports in one process, alternating, ROUNDS rounds; medians and ranges in ms.
The kernel library is WICORE_CACHE's build of the sources on PYTHONPATH. usage: prefill_ab.py NAME=DIR... (env LEN
512, ROUNDS 5, THREADS 2)"""
import os, statistics, sys, time
from pathlib import Path
import numpy as np
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
n, rounds, th = int(os.environ.get("LEN", "512")), int(os.environ.get("ROUNDS", "5")), int(os.environ.get("THREADS", "2"))
engines = {s.split("=", 1)[0]: Engine(EngineConfig(model_dir=Path(s.split("=", 1)[1]), num_threads=th, host_tier_gb=0)) for s in sys.argv[1:]}
rng = np.random.default_rng(0)
times = {k: [] for k in engines}
firsts = {}
for r in range(rounds + 1):
    prompt = rng.integers(1000, 20000, n).tolist()
    for k, e in engines.items():
        t = time.perf_counter()
        (c,) = e.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
        if r: times[k].append(time.perf_counter() - t)  # the first round warms up
        firsts.setdefault(r, {})[k] = c.token_ids[0]
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} threads {th} len {n} | " + " | ".join(
    f"{k} {1e3*statistics.median(v):.0f} ms ({1e3*min(v):.0f}-{1e3*max(v):.0f}, {n/statistics.median(v):.0f} tok/s)" for k, v in times.items())
    + f" | first tokens equal: {sum(len(set(v.values())) == 1 for v in firsts.values())}/{len(firsts)}")
for e in engines.values(): e.__exit__(None, None, None)
