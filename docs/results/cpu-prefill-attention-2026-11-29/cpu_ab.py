"""One engine's 512-token prefill, CPU seconds of the process (and wall), `threads` threads, n runs after a warm-up."""
import sys, time
from pathlib import Path
import numpy as np
engine_name, threads, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
T = 512
rng = np.random.default_rng(0)
prompts = [rng.integers(1000, 200000, T).tolist() for _ in range(n + 1)]
out = []
if engine_name == "llama.cpp":
    from benchlib import gguf_path, import_llama_cpp
    llama_cpp = import_llama_cpp()
    llm = llama_cpp.Llama(model_path=str(gguf_path()), n_ctx=T + 16, n_threads=threads, n_threads_batch=threads, n_batch=512, logits_all=False, verbose=False)
    for p in prompts:
        llm.reset(); c = time.process_time(); t = time.perf_counter(); llm.eval([2] + p[1:]); out.append((time.process_time() - c, time.perf_counter() - t))
else:
    from step_timing import Config, engine_config
    from wicore.engine.engine import Engine
    from wicore.types.sampling import SamplingParams
    model = Path(sys.argv[4])
    config = Config((str(model),), (1,), T + 8, threads, 1, "cpu", False, None)
    import dataclasses, os
    from wicore.engine.scheduler_config import SchedulerConfig
    ec = engine_config(model, 1, config)
    chunk = int(os.environ.get("P37_CHUNK", "256"))
    ec = dataclasses.replace(ec, scheduler=SchedulerConfig(max_num_seqs=1, prefill_chunk=chunk))
    with Engine(ec) as engine:
        core = engine.core
        for r, p in enumerate(prompts):
            core.add(core.make_request([2] + p[1:], SamplingParams(max_tokens=1, ignore_eos=True), f"p{r}"))
            c = time.process_time(); t = time.perf_counter()
            while not any(o.finished for o in core.step()): pass
            out.append((time.process_time() - c, time.perf_counter() - t))
cpu = sorted(o[0] for o in out[1:]); wall = sorted(o[1] for o in out[1:])
print(f"{sys.argv[5] if len(sys.argv) > 5 else engine_name} threads={threads}: cpu s median {cpu[len(cpu)//2]:.3f} min {cpu[0]:.3f}  wall median {wall[len(wall)//2]:.3f} min {wall[0]:.3f}  ({T} tok)", flush=True)
