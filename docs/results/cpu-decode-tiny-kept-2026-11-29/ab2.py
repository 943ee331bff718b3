"""Ad-hoc: WiCore exports (optionally with given kernel libraries / source trees are set by PYTHONPATH) and llama.cpp,
THREADS threads each, decode steps alternating; wall time (perf_counter) and process CPU time a step, medians.
usage: ab2.py GGUF NAME=DIR[@LIB] ...   env THREADS (2), STEPS (300)"""
import os, statistics, sys, time
from pathlib import Path
import numpy as np
from benchlib import argmax_logits, import_llama_cpp, llama_cpp_info
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
gguf, specs = sys.argv[1], sys.argv[2:]
steps_n, nprompt, th = int(os.environ.get("STEPS", "300")), 128, int(os.environ.get("THREADS", "2"))
llama_cpp = import_llama_cpp()
info = llama_cpp_info()
prompt = np.random.default_rng(0).integers(1000, 20000, nprompt).tolist()
llm = llama_cpp.Llama(model_path=gguf, n_ctx=nprompt + steps_n + 16, n_threads=th, n_threads_batch=th, verbose=False)
nv = llm.n_vocab()
names, cores, engines, wall, cpu = [], [], [], {}, {}
default_lib = G.kernel_library
for spec in specs:
    name, rest = spec.split("=", 1)
    d, _, lib = rest.partition("@")
    G.kernel_library = (lambda devices, lib=lib: Path(lib)) if lib else default_lib
    cfg = Config((d,), (1,), nprompt, th, steps_n, "cpu", False, None)
    e = Engine(engine_config(Path(d), 1, cfg)); engines.append(e)
    c = e.core
    c.add(c.make_request(prompt, SamplingParams(max_tokens=steps_n + 8, ignore_eos=True), "x"))
    while True:
        c.step()
        rows = c.last_step.rows
        if rows and all(len(r.token_ids) == 1 for r in rows): break
    names.append(name); cores.append(c); wall[name] = []; cpu[name] = []
G.kernel_library = default_lib
llm.eval(prompt); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); wall["llama.cpp"] = []; cpu["llama.cpp"] = []
for _ in range(steps_n):
    for name, c in zip(names, cores):
        t, p = time.perf_counter(), time.process_time(); c.step(); wall[name].append(time.perf_counter() - t); cpu[name].append(time.process_time() - p)
    t, p = time.perf_counter(), time.process_time(); llm.eval([tok]); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv)
    wall["llama.cpp"].append(time.perf_counter() - t); cpu["llama.cpp"].append(time.process_time() - p)
ref = statistics.median(wall["llama.cpp"]); ref10 = np.percentile(wall["llama.cpp"], 10)
print(" ".join(f"{k} p10 {1000*np.percentile(v,10):.3f} p50 {1000*np.percentile(v,50):.3f}" for k, v in wall.items()))
print(f"threads {th} extra_buffers {info.get('extra_buffers')} | " + " | ".join(
    f"{k} {1000*statistics.median(v):.3f} ms {ref/statistics.median(v):.2f}x (p10 {ref10/np.percentile(v, 10):.2f}x, cpu {1000*statistics.median(cpu[k]):.2f})" for k, v in wall.items()))
llm.close()
for e in engines: e.__exit__(None, None, None)
