"""Ad-hoc: several WiCore exports and llama.cpp, one thread each, decode steps alternating (CPU time)."""
import statistics, sys, time
from pathlib import Path
import numpy as np
from benchlib import argmax_logits, import_llama_cpp
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
gguf, dirs = sys.argv[1], sys.argv[2:]
steps_n, nprompt = int(__import__("os").environ.get("STEPS", "300")), 128
llama_cpp = import_llama_cpp()
prompt = np.random.default_rng(0).integers(1000, 20000, nprompt).tolist()
llm = llama_cpp.Llama(model_path=gguf, n_ctx=nprompt + steps_n + 16, n_threads=1, n_threads_batch=1, verbose=False)
nv = llm.n_vocab()
cores, engines, times = [], [], {}
for d in dirs:
    cfg = Config((d,), (1,), nprompt, 1, steps_n, "cpu", False, None)
    e = Engine(engine_config(Path(d), 1, cfg)); engines.append(e)
    c = e.core
    c.add(c.make_request(prompt, SamplingParams(max_tokens=steps_n + 8, ignore_eos=True), "x"))
    while True:
        c.step()
        rows = c.last_step.rows
        if rows and all(len(r.token_ids) == 1 for r in rows): break
    cores.append(c); times[d] = []
llm.eval(prompt); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); times["llama.cpp"] = []
for _ in range(steps_n):
    for d, c in zip(dirs, cores):
        t = time.thread_time(); c.step(); times[d].append(time.thread_time() - t)
    t = time.thread_time(); llm.eval([tok]); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); times["llama.cpp"].append(time.thread_time() - t)
ref = statistics.median(times["llama.cpp"]); ref10 = np.percentile(times["llama.cpp"], 10)
for k, v in times.items():
    m = statistics.median(v); p10 = np.percentile(v, 10)
    print(f"{1000*m:7.3f} ms  {ref/m:5.2f}x  p10 {1000*p10:7.3f} ms {ref10/p10:5.2f}x  {k}")
for e in engines: e.close()
llm.close()
