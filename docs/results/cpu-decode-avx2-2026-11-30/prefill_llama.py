"""llama.cpp's prefill of LEN random tokens (time to the first logits), ROUNDS rounds after one warm-up."""
import os, statistics, sys, time
import numpy as np, llama_cpp
gguf, n, rounds = sys.argv[1], int(os.environ.get("LEN", "512")), int(os.environ.get("ROUNDS", "5"))
llm = llama_cpp.Llama(model_path=gguf, n_ctx=n + 16, n_threads=2, n_threads_batch=2, n_batch=512, verbose=False)
rng = np.random.default_rng(0); ts = []
for r in range(rounds + 1):
    toks = rng.integers(1000, 20000, n).tolist(); llm.reset(); t = time.perf_counter(); llm.eval(toks)
    if r: ts.append(time.perf_counter() - t)
print(f"llama.cpp {os.path.basename(gguf)} len {n}: {1e3*statistics.median(ts):.0f} ms ({1e3*min(ts):.0f}-{1e3*max(ts):.0f}, {n/statistics.median(ts):.0f} tok/s)")
