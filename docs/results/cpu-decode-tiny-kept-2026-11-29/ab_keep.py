"""Ad-hoc (issue 37, 2026-11-29): WiCore engines and llama.cpp, THREADS threads each, decode steps alternating
step by step. Per step: wall time (perf_counter) and the calling thread's CPU time (thread_time); medians and p10.
usage: ab_keep.py GGUF NAME=DIR[:nokeep] ...   (nokeep: that engine runs as before this branch: its graphs never
keep their binding (wicore/executor/kept_binding.py) and its runner's _pairs is main's, swapped in around its steps).  env THREADS (2), STEPS (300)"""
import os, statistics, sys, time
from pathlib import Path
import numpy as np
from benchlib import argmax_logits, import_llama_cpp, llama_cpp_info
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
gguf, specs = sys.argv[1], sys.argv[2:]
steps_n, nprompt, th = int(os.environ.get("STEPS", "300")), 128, int(os.environ.get("THREADS", "2"))
llama_cpp = import_llama_cpp()
info = llama_cpp_info()
prompt = np.random.default_rng(0).integers(1000, 20000, nprompt).tolist()
llm = llama_cpp.Llama(model_path=gguf, n_ctx=nprompt + steps_n + 16, n_threads=th, n_threads_batch=th, verbose=False)
nv = llm.n_vocab()
import wicore.executor.runner as R
new_pairs = R._pairs
def old_pairs(pairs):
    array = np.asarray(pairs, np.int64).reshape(-1, 2)
    return array[:, 0].copy(), array[:, 1].copy()
names, cores, engines, wall, cpu, toks, olds = [], [], [], {}, {}, {}, set()
for spec in specs:
    name, rest = spec.split("=", 1)
    d, _, opt = rest.partition(":")
    e = Engine(engine_config(Path(d), 1, Config((d,), (1,), nprompt, th, steps_n, "cpu", False, None)))
    engines.append(e)
    c = e.core
    if opt == "nokeep":
        c.runner.graphs._keeps_binding = lambda i, results: False
        olds.add(name)
    c.add(c.make_request(prompt, SamplingParams(max_tokens=steps_n + 8, ignore_eos=True), "x"))
    while True:
        c.step()
        rows = c.last_step.rows
        if rows and all(len(r.token_ids) == 1 for r in rows): break
    names.append(name); cores.append(c); wall[name] = []; cpu[name] = []; toks[name] = []
llm.eval(prompt); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); wall["llama.cpp"] = []; cpu["llama.cpp"] = []
for _ in range(steps_n):
    for name, c in zip(names, cores):
        R._pairs = old_pairs if name in olds else new_pairs
        t, p = time.perf_counter(), time.thread_time(); out = c.step(); wall[name].append(time.perf_counter() - t); cpu[name].append(time.thread_time() - p)
        toks[name] += [t for o in out for t in getattr(o, "new_token_ids", [])]
    t, p = time.perf_counter(), time.thread_time(); llm.eval([tok]); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv)
    wall["llama.cpp"].append(time.perf_counter() - t); cpu["llama.cpp"].append(time.thread_time() - p)
def stat(v): return statistics.median(v), float(np.percentile(v, 10))
rw, rw10 = stat(wall["llama.cpp"]); rc, rc10 = stat(cpu["llama.cpp"])
print(f"threads {th} extra_buffers {info.get('extra_buffers')} load {os.getloadavg()[0]:.2f} | " + " | ".join(
    f"{k} wall {1e3*stat(v)[0]:.3f} ({rw/stat(v)[0]:.2f}x, p10 {rw10/stat(v)[1]:.2f}x) cpu {1e3*stat(cpu[k])[0]:.3f} ({rc/stat(cpu[k])[0]:.2f}x, p10 {rc10/stat(cpu[k])[1]:.2f}x)"
    for k, v in wall.items()))
if len(names) > 1: print("same tokens:", all(toks[n] == toks[names[0]] for n in names), len(toks[names[0]]))
llm.close()
for e in engines: e.__exit__(None, None, None)
