"""Ad-hoc: WiCore exports with given kernel libraries, and llama.cpp, one thread each, decode steps alternating (CPU time).
usage: multi2.py GGUF NAME=DIR[@LIB] ...   (LIB: a libwicore_kernels.so; default this tree's)"""
import os, statistics, sys, time
from pathlib import Path
import numpy as np
from benchlib import argmax_logits, import_llama_cpp
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
gguf, specs = sys.argv[1], sys.argv[2:]
steps_n, nprompt = int(os.environ.get("STEPS", "300")), 128
llama_cpp = import_llama_cpp()
prompt = np.random.default_rng(0).integers(1000, 20000, nprompt).tolist()
llm = llama_cpp.Llama(model_path=gguf, n_ctx=nprompt + steps_n + 16, n_threads=1, n_threads_batch=1, verbose=False)
nv = llm.n_vocab()
names, cores, engines, times = [], [], [], {}
default_lib = G.kernel_library
for spec in specs:
    name, rest = spec.split("=", 1)
    d, _, lib = rest.partition("@")
    G.kernel_library = (lambda devices, lib=lib: Path(lib)) if lib else default_lib
    cfg = Config((d,), (1,), nprompt, 1, steps_n, "cpu", False, None)
    e = Engine(engine_config(Path(d), 1, cfg)); engines.append(e)
    c = e.core
    c.add(c.make_request(prompt, SamplingParams(max_tokens=steps_n + 8, ignore_eos=True), "x"))
    while True:
        c.step()
        rows = c.last_step.rows
        if rows and all(len(r.token_ids) == 1 for r in rows): break
    names.append(name); cores.append(c); times[name] = []
G.kernel_library = default_lib
llm.eval(prompt); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); times["llama.cpp"] = []
for _ in range(steps_n):
    for name, c in zip(names, cores):
        t = time.thread_time(); c.step(); times[name].append(time.thread_time() - t)
    t = time.thread_time(); llm.eval([tok]); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); times["llama.cpp"].append(time.thread_time() - t)
ref = statistics.median(times["llama.cpp"]); ref10 = np.percentile(times["llama.cpp"], 10)
print(" | ".join(f"{k} {1000*statistics.median(v):.3f} ms {ref/statistics.median(v):.2f}x (p10 {ref10/np.percentile(v, 10):.2f}x)" for k, v in times.items()))

llm.close()
