"""Tables of ab_*.jsonl: per round and concurrency, off / on tok/s, TTFT p99, ITL p99, CPU seconds.

    python summarize.py ab_stand_in.jsonl
"""

import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1])]
alone = {r["round"]: r for r in rows if "mode" not in r or r.get("mode") == "alone"}
levels = defaultdict(dict)
for r in rows:
    if r.get("mode") in ("off", "on"):
        levels[(r["round"], r["concurrency"])][r["mode"]] = r


def cell(r):
    p99 = lambda k: round(r[k]["p99"]) if r.get(k) else "-"
    tokens = r["num_output_tokens"] or 1
    cpu = 1e3 * (r["server_cpu_s"] + r["child_cpu_s"]) / tokens
    fail = f", {r['num_failed']} failed" if r["num_failed"] else ""
    return f"{r['output_tokens_per_second']:,.0f} ({p99('ttft')} / {p99('itl')}; {1e3 * r['server_cpu_s'] / tokens:.3f} + {1e3 * r['child_cpu_s'] / tokens:.3f} = {cpu:.3f} ms{fail})"


print("| round | streams | load off / on | off: tok/s (TTFT p99 / ITL p99 ms; CPU a token: server + child) | on | on / off |")
print("|---|---:|---|---|---|---:|")
ratios = defaultdict(list)
for (rnd, c), m in sorted(levels.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
    if "off" in m and "on" in m:
        ratio = m["on"]["output_tokens_per_second"] / m["off"]["output_tokens_per_second"]
        ratios[c].append(ratio)
        print(f"| {rnd} | {c} | {m['off']['load']} / {m['on']['load']} | {cell(m['off'])} | {cell(m['on'])} | {ratio:.2f} |")
print()
for c, rs in sorted(ratios.items(), reverse=True):
    print(f"{c} streams: on / off median {statistics.median(rs):.2f}, each {', '.join(f'{x:.2f}' for x in rs)}")
for rnd, a in sorted(alone.items()):
    print(f"round {rnd} alone: {a.get('alone_256_64') or round(a.get('output_tokens_per_second', 0))} (load {a['load']})")

print()
print("| streams | off tok/s, median | on tok/s, median | on / off, each round | median | TTFT p99 off / on (ms, median) | server CPU a token off / on (ms) | + the child's (on) |")
print("|---:|---:|---:|---|---:|---|---|---:|")
med = statistics.median
for c in sorted(ratios, reverse=True):
    pairs = [m for (rnd, cc), m in sorted(levels.items()) if cc == c and "off" in m and "on" in m]
    tok = lambda mode: med([m[mode]["output_tokens_per_second"] for m in pairs])
    ttft = lambda mode: med([m[mode]["ttft"]["p99"] for m in pairs if m[mode]["ttft"]])
    cpu = lambda mode, who: med([1e3 * m[mode][who] / m[mode]["num_output_tokens"] for m in pairs])
    print(f"| {c} | {tok('off'):,.0f} | {tok('on'):,.0f} | {', '.join(f'{x:.2f}' for x in ratios[c])} | **{med(ratios[c]):.2f}** | "
          f"{ttft('off'):,.0f} / {ttft('on'):,.0f} | {cpu('off', 'server_cpu_s'):.3f} / {cpu('on', 'server_cpu_s'):.3f} | {cpu('on', 'child_cpu_s'):.3f} |")
