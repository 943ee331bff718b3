"""Ad-hoc (issue 37, 2026-11-29; :widen / :narrow added 2026-11-30): WiCore exports (each with a kernel library) and llama.cpp, THREADS threads each,
decode steps alternating. BLOCK=1: step by step (as ab_keep.py); BLOCK=b > 1: b steps of one engine, then b of the
next, the first DROP of each block not counted, GAP seconds idle before each block, the WiCore engines' order
reversed every other turn (at two threads another engine's idle ORT worker or llama.cpp's threads still spin for a
while after their step: step-by-step turns time them, not the engine; without the gap and the turn an A/A run of
one export twice timed the second 7-12% slower by its p10).
Per step: wall time and the calling thread's CPU time; medians and p10; ratios llama.cpp / engine.
usage: step_ab6.py GGUF NAME=DIR[@LIB][:nospin|:nosteady|:widen|:narrow] ...   (host37: :nosteady, EngineConfig(steady_decode=False))   env THREADS (2), STEPS (300), BLOCK (10), DROP (2), GAP (0.02)"""
import os, statistics, sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np
from benchlib import argmax_logits, import_llama_cpp, llama_cpp_info
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
gguf, specs = sys.argv[1], sys.argv[2:]
steps_n, nprompt, th = int(os.environ.get("STEPS", "300")), 128, int(os.environ.get("THREADS", "2"))
block, drop = int(os.environ.get("BLOCK", "10")), int(os.environ.get("DROP", "2"))
gap = float(os.environ.get("GAP", "0.02"))  # seconds idle before each block: the last engine's spinning threads sleep
if block == 1: drop = 0
llama_cpp = import_llama_cpp()
info = llama_cpp_info()
prompt = np.random.default_rng(0).integers(1000, 20000, nprompt).tolist()
llm = llama_cpp.Llama(model_path=gguf, n_ctx=nprompt + steps_n + 16, n_threads=th, n_threads_batch=th, verbose=False)
nv = llm.n_vocab()
default_lib, default_options = G.kernel_library, G.session_options
names, cores, engines, wall, cpu, toks = [], [], [], {}, {}, {}
for spec in specs:
    name, rest = spec.split("=", 1)
    rest, _, opt = rest.partition(":")  # nospin: its sessions' ONNX Runtime workers sleep when idle, never spin
    # widen / narrow (2026-11-30): WICORE_MATMULQ_WIDEN=1 / 0 while its sessions are made (a head's codes 8 bits wide or not)
    os.environ.pop("WICORE_MATMULQ_WIDEN", None)
    if opt in ("widen", "narrow"): os.environ["WICORE_MATMULQ_WIDEN"] = "1" if opt == "widen" else "0"
    d, _, lib = rest.partition("@")
    G.kernel_library = (lambda devices, lib=lib: Path(lib)) if lib else default_lib
    def options(*a, _spin="0" if opt == "nospin" else "1", **k):
        opts = default_options(*a, **k)
        opts.add_session_config_entry("session.intra_op.allow_spinning", _spin)
        return opts
    G.session_options = options
    ec = engine_config(Path(d), 1, Config((d,), (1,), nprompt, th, steps_n, "cpu", False, None))
    e = Engine(replace(ec, steady_decode=opt != "nosteady"))
    engines.append(e)
    c = e.core
    c.add(c.make_request(prompt, SamplingParams(max_tokens=steps_n + 8, ignore_eos=True), "x"))
    while True:
        c.step()
        rows = c.last_step.rows
        if rows and all(len(r.token_ids) == 1 for r in rows): break
    names.append(name); cores.append(c); wall[name] = []; cpu[name] = []; toks[name] = []
G.kernel_library, G.session_options = default_lib, default_options
os.environ.pop("WICORE_MATMULQ_WIDEN", None)
llm.eval(prompt); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv); wall["llama.cpp"] = []; cpu["llama.cpp"] = []; toks["llama.cpp"] = [tok]
load0 = os.getloadavg()[0]
def wicore_step(name, c, keep):
    t, p = time.perf_counter(), time.thread_time(); out = c.step(); w, u = time.perf_counter() - t, time.thread_time() - p
    toks[name].extend(t for o in out for t in getattr(o, "new_token_ids", []))
    if keep: wall[name].append(w); cpu[name].append(u)
def llama_step(keep):
    global tok
    t, p = time.perf_counter(), time.thread_time(); llm.eval([tok]); tok = argmax_logits(llama_cpp, llm.ctx, -1, nv)
    w, u = time.perf_counter() - t, time.thread_time() - p
    toks["llama.cpp"].append(tok)
    if keep: wall["llama.cpp"].append(w); cpu["llama.cpp"].append(u)
done, turn = 0, 0
order = list(zip(names, cores))
while done < steps_n:
    b = min(block, steps_n - done)
    for name, c in (order if turn % 2 == 0 else order[::-1]):  # each WiCore engine after the other as often
        time.sleep(gap)
        for i in range(b): wicore_step(name, c, i >= drop)
    time.sleep(gap)
    for i in range(b): llama_step(i >= drop)
    done += b; turn += 1
def stat(v): return statistics.median(v), float(np.percentile(v, 10))
rw, rw10 = stat(wall["llama.cpp"]); rc, rc10 = stat(cpu["llama.cpp"])
print(f"{time.strftime('%H:%M:%S', time.gmtime())} threads {th} block {block} drop {drop} gap {gap} extra_buffers {info.get('extra_buffers')} load {load0:.2f}-{os.getloadavg()[0]:.2f} | " + " | ".join(
    f"{k} wall {1e3*stat(v)[0]:.3f} p10 {1e3*stat(v)[1]:.3f} ({rw/stat(v)[0]:.2f}x, p10 {rw10/stat(v)[1]:.2f}x) cpu {1e3*stat(cpu[k])[0]:.3f} ({rc/stat(cpu[k])[0]:.2f}x)"
    for k, v in wall.items()))
lt = toks["llama.cpp"][2:]  # its first came from the prompt; WiCore's warm-up loop ends after its first decode step
n = min(len(v) for v in [lt, *(toks[k] for k in names)])
print("same tokens among WiCore's:", all(toks[k][:n] == toks[names[0]][:n] for k in names), n, "| equal to llama.cpp's:", [sum(a == b for a, b in zip(toks[k][:n], lt[:n])) for k in names])
if os.environ.get("SHOW"): print({k: v[:8] for k, v in toks.items()})
llm.close()
for e in engines: e.__exit__(None, None, None)
