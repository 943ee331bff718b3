"""Ad-hoc: ONNX Runtime's profile of N decode steps (THREADS threads), per node: median duration (us) over steps."""
import glob, json, os, statistics, sys
from collections import defaultdict
from pathlib import Path
import numpy as np
from step_timing import Config, engine_config
import wicore.executor.graphs as G
from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams
model = Path(sys.argv[1]); lib = sys.argv[2] if len(sys.argv) > 2 else None
if lib: G.kernel_library = lambda devices: Path(lib)
th = int(os.environ.get("THREADS", "2")); n = int(os.environ.get("STEPS", "200"))
cfg = Config((str(model),), (1,), 128, th, n + 20, "cpu", False, None)
prompt = np.random.default_rng(0).integers(1000, 20000, 128).tolist()
prefix = f"/work/cache-small37/prof/p{th}"
os.makedirs("/work/cache-small37/prof", exist_ok=True)
for f in glob.glob(prefix + "*"): os.remove(f)
with Engine(engine_config(model, 1, cfg, profile_prefix=prefix)) as engine:
    core = engine.core
    core.add(core.make_request(prompt, SamplingParams(max_tokens=n + 20, ignore_eos=True), "x"))
    for _ in range(n): core.step()
files = glob.glob(prefix + "*.json")
ev = json.load(open(max(files, key=os.path.getmtime)))
per = defaultdict(list); runs = []
for e in ev:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        per[(e["name"][:-12], e["args"].get("op_name"))].append(e["dur"])
    if e.get("cat") == "Session" and e["name"] == "model_run": runs.append(e["dur"])
runs = runs[-150:]
tot = 0
rows = []
for (name, op), d in per.items():
    d = d[-150:]; m = statistics.median(d); tot += m; rows.append((m, name, op, len(d)))
rows.sort(reverse=True)
print(f"threads {th}: model_run median {statistics.median(runs):.0f} us, nodes {len(rows)}, sum of node medians {tot:.0f} us")
by = defaultdict(float)
for m, name, op, c in rows: by[op] += m
print("by op:", ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))
for m, name, op, c in rows[:25]: print(f"  {m:7.1f} {op:22s} {name}")
# what a fused prologue (BlockAttentionQKV-like: split, RoPE and the K/V write inside the attention op) would remove
fusable = [r for r in rows if r[1].startswith("/model/shared/") or any(t in r[1] for t in ("qkv_split", "_rope/", "k_heads", "v_heads", "_cache/ScatterND"))]
print(f"fusable prologue: {len(fusable)} nodes, {sum(r[0] for r in fusable):.0f} us (sum of medians)")
rest = [r for r in rows if r not in fusable and "lm_head/MatMulQ" not in r[1]]
print(f"the rest but the head: {len(rest)} nodes, {sum(r[0] for r in rest):.0f} us")
