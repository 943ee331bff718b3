"""The kept binding's session.run alone, repeated (same inputs), engines with option variants interleaved."""
import os, statistics, sys, time
from pathlib import Path
import numpy as np
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); th = int(os.environ.get("THREADS", "2"))
variants = sys.argv[2:] or ["base"]
default = G.session_options
def mk(entries):
    def options(*a, **k):
        o = default(*a, **k)
        for kv in entries:
            key, val = kv.split("=", 1)
            if key == "mem_pattern": o.enable_mem_pattern = val == "1"
            elif key == "cpu_arena": o.enable_cpu_mem_arena = val == "1"
            elif key == "opt": import onnxruntime as ort; o.graph_optimization_level = getattr(ort.GraphOptimizationLevel, val)
            else: o.add_session_config_entry(key, val)
        return o
    return options
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
engs = []
for v in variants:
    G.session_options = mk([] if v == "base" else v.split(","))
    e = Engine(engine_config(model, 1, Config((str(model),), (1,), 128, th, 400, "cpu", False, None)))
    c = e.core
    c.add(c.make_request(prompt, SamplingParams(max_tokens=300, ignore_eos=True), "x"))
    for _ in range(5): c.step()
    g = c.runner.graphs
    engs.append((v, e, g.sessions[0], g.kept.get(0).binding, g._run_options))
G.session_options = default
times = {v: [] for v in variants}
for turn in range(int(os.environ.get("TURNS", "30"))):
    for v, e, s, b, ro in (engs if turn % 2 == 0 else engs[::-1]):
        time.sleep(0.02)
        for i in range(12):
            t = time.perf_counter(); s.run_with_iobinding(b, ro); d = time.perf_counter() - t
            if i >= 2: times[v].append(d)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} threads {th} | " + " | ".join(f"{v}: med {1e3*statistics.median(t):.3f} p10 {1e3*np.percentile(t,10):.3f}" for v, t in times.items()))
for v, e, *_ in engs: e.__exit__(None, None, None)
