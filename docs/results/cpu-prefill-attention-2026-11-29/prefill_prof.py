"""Per-node ORT profile of a 512-token prefill (batch 1)."""
import json, sys, tempfile, time
from collections import Counter
from pathlib import Path
import numpy as np
from step_timing import Config, engine_config
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); threads = int(sys.argv[2]); n_runs = 3; T = 512
config = Config((str(model),), (1,), T + 8, threads, 1, "cpu", True, None)
per = Counter(); kinds = Counter()
with tempfile.TemporaryDirectory() as folder:
    with Engine(engine_config(model, 1, config, f"{folder}/p")) as engine:
        core = engine.core
        rng = np.random.default_rng(0)
        for r in range(n_runs + 1):
            prompt = rng.integers(1000, engine.manifest.config.vocab_size, T).tolist()
            core.add(core.make_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), f"p{r}"))
            t0 = time.perf_counter(); c0 = time.process_time()
            while True:
                outs = core.step()
                if any(o.finished for o in outs): break
            print(f"run {r}: wall {time.perf_counter()-t0:.3f}s cpu {time.process_time()-c0:.3f}s")
        paths = [Path(s.end_profiling()) for s in core.runner.graphs.sessions]
    ev = [e for p in paths for e in json.loads(p.read_text())]
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "model_run")
    big = [r for r in runs if r[1]-r[0] > 20000][-n_runs:]
    runtot = sum(b - a for a, b in big) / len(big)
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(a <= e["ts"] <= b for a, b in big):
            per[e["name"][:-12]] += e["dur"] / len(big)
            kinds[e.get("args", {}).get("op_name", "?")] += e["dur"] / len(big)
tot = sum(per.values())
print(f"model_run {runtot/1000:.1f} ms, nodes {tot/1000:.1f} ms, {len(per)} nodes, {len(runs)} runs {[round((b-a)/1000) for a,b in runs]}")
for k, v in kinds.most_common(): print(f"{v/1000:8.2f} ms {k}")
import re
agg = Counter()
for k, v in per.items(): agg[re.sub(r"layers\.\d+", "layers.N", k)] += v
for k, v in agg.most_common(25): print(f"{v/1000:8.2f} {k}")
