"""Ad-hoc (issue 37, 2026-11-30): ab.sh's lines summed up per model and engine: the median over runs of the median
step (ms), and of its ratio llama.cpp / engine with the range over runs; the load range. Runs where llama.cpp's
median was above 1.5x its p10 (starved by other tenants) are left out and counted. usage: summarize.py FILE..."""
import re, statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
loads, dropped = defaultdict(list), defaultdict(int)
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"(\S+) load (\S+) \S+ \S+ (\S+) round \d+: .*threads (\d+)", line)
        if not m: continue
        model = f"{m.group(3)} T{m.group(4)}"
        engines = dict((k, (float(w), float(p))) for k, w, p in re.findall(r"\| (\S+) wall ([\d.]+) p10 ([\d.]+)", line))
        if "llama.cpp" not in engines: continue
        lw, lp = engines["llama.cpp"]
        if lw > 1.5 * lp: dropped[model] += 1; continue
        loads[model].append(float(m.group(2)))
        for k, (w, p) in engines.items():
            runs[model][k].append((w, lw / w))
for model, by in runs.items():
    print(f"{model}: {len(by['llama.cpp'])} runs (load {min(loads[model]):.2f}-{max(loads[model]):.2f}; {dropped[model]} starved left out)")
    for k, v in by.items():
        ms = [w for w, _ in v]; rs = [r for _, r in v]
        print(f"  {k:10s} {statistics.median(ms):7.3f} ms ({min(ms):.3f}-{max(ms):.3f})  {statistics.median(rs):.2f}x llama.cpp ({min(rs):.2f}-{max(rs):.2f})")
